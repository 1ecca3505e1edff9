"""Whole runs in virtual time: determinism, pairing, recorded tables, crash safety."""

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from loadgen.core.recording import PARTS_DIR, RunRecorder, merge_parts
from loadgen.core.runner import RunKey, run_keys, run_simulated
from tests.conftest import make_spec_dict
from loadgen.core.spec import parse_spec


def _turns(out, run_id):
    return pq.read_table(out / "runs" / run_id / "turns.parquet")


def test_same_spec_and_seed_give_bit_identical_results(tmp_path, tiny_spec):
    run_simulated(tiny_spec, RunKey("burst", 1), tmp_path / "a")
    run_simulated(tiny_spec, RunKey("burst", 1), tmp_path / "b")
    for name in ("turns.parquet", "samples.parquet"):
        a = (tmp_path / "a" / "runs" / "burst-s1" / name).read_bytes()
        b = (tmp_path / "b" / "runs" / "burst-s1" / name).read_bytes()
        assert pq.read_table(tmp_path / "a" / "runs" / "burst-s1" / name).num_rows > 0
        assert a == b


def test_turn_records_are_consistent(tmp_path, tiny_spec):
    info = run_simulated(tiny_spec, RunKey("base", 2), tmp_path)
    t = _turns(tmp_path, "base-s2").to_pydict()
    n = len(t["session_id"])
    assert n == info["counts"]["turns_completed"] > 0
    for i in range(n):
        assert t["ready_s"][i] <= t["admit_s"][i] < t["first_token_s"][i] <= t["finish_s"][i] <= 600
        assert 0 <= t["cached_tokens"][i] < t["prompt_tokens"][i]
        assert t["output_tokens"][i] == 100 and t["error"][i] is None
    # a session's later turns hit its own previous context (prompt + output - 1, whole blocks)
    by_session = {}
    for i in range(n):
        by_session.setdefault(t["session_id"][i], []).append(i)
    rows = by_session[min(by_session)]
    first, second = rows[0], rows[1]
    assert t["turn_index"][second] == 1
    expected = (t["prompt_tokens"][first] + 100 - 1) // 16 * 16
    assert t["cached_tokens"][second] == expected


def test_base_sessions_match_across_arms_until_the_trigger(tmp_path, tiny_spec):
    run_simulated(tiny_spec, RunKey("base", 1), tmp_path)
    run_simulated(tiny_spec, RunKey("burst", 1), tmp_path)
    a = _turns(tmp_path, "base-s1").to_pydict()
    b = _turns(tmp_path, "burst-s1").to_pydict()
    before = lambda t: [(s, k, f) for s, k, f in zip(t["session_id"], t["turn_index"], t["finish_s"]) if f < 120]
    assert before(a) == before(b) and before(a)
    assert any(b["is_trigger_session"]) and not any(a["is_trigger_session"])


def test_samples_cover_the_run_every_interval(tmp_path, tiny_spec):
    run_simulated(tiny_spec, RunKey("base", 1), tmp_path)
    s = pq.read_table(tmp_path / "runs" / "base-s1" / "samples.parquet").to_pydict()
    assert s["t_s"] == [10.0 * i for i in range(61)]
    for i in range(61):
        assert s["sessions_in_system"][i] == (s["sessions_thinking"][i] + s["sessions_in_engine"][i]
                                              + s["sessions_gateway_waiting"][i] + s["sessions_parked"][i])
        assert 0.0 <= s["kv_usage"][i] <= 1.0
        assert s["prefix_cache_hits_total"][i] <= s["prefix_cache_queries_total"][i]
    assert s["sessions_arrived_total"][-1] >= s["sessions_completed_total"][-1] > 0


def test_run_json_describes_the_run(tmp_path, tiny_spec):
    run_simulated(tiny_spec, RunKey("burst", 2), tmp_path)
    info = json.loads((tmp_path / "runs" / "burst-s2" / "run.json").read_text())
    assert info["status"] == "completed" and info["seed"] == 2 and info["arm"] == "burst"
    assert info["triggers"] == [{"kind": "burst", "start_s": 120.0, "end_s": 240.0}]
    assert info["reference_trigger_end_s"] == 240.0
    assert info["spec"]["seeds"] == [2] and info["loadgen_version"]
    assert not (tmp_path / "runs" / "burst-s2" / PARTS_DIR).exists()


def test_flush_trigger_preempts_and_empties_the_cache(tmp_path):
    data = make_spec_dict()
    data["arms"] = [{"name": "flush", "triggers": [{"kind": "flush", "at_s": 300}]}, {"name": "base"}]
    data["workload"]["arrival_rate_per_s"] = 0.3
    spec = parse_spec(data)
    info = run_simulated(spec, RunKey("flush", 1), tmp_path)
    run_simulated(spec, RunKey("base", 1), tmp_path)
    (flushed_at,) = info["counts"]["flush_times_s"]
    assert 300.0 <= flushed_at < 301.0  # applied at the next step boundary, as vLLM does
    assert info["counts"]["engine_preemptions"] > 0  # requests running at the flush were preempted
    t = _turns(tmp_path, "flush-s1").to_pydict()
    b = _turns(tmp_path, "base-s1").to_pydict()

    def resumed_after_flush(t):
        """Turns k > 0 whose previous turn finished before the flush, admitted after it."""
        finish = {(s, k): f for s, k, f in zip(t["session_id"], t["turn_index"], t["finish_s"])}
        return {(s, k): c for s, k, a, c in zip(t["session_id"], t["turn_index"], t["admit_s"], t["cached_tokens"])
                if k > 0 and a >= 300 and finish.get((s, k - 1), 1e9) < 300}

    flushed, kept = resumed_after_flush(t), resumed_after_flush(b)
    assert flushed
    # the session's own context is gone: at most the shared system prompt was recomputed since
    assert all(c <= 2000 for c in flushed.values())
    assert all(kept[key] > 2000 for key in flushed if key in kept)


def test_caching_off_is_a_control_with_zero_hits(tmp_path):
    data = make_spec_dict()
    data["engine"]["enable_prefix_caching"] = False
    spec = parse_spec(data)
    run_simulated(spec, RunKey("base", 1), tmp_path)
    t = _turns(tmp_path, "base-s1").to_pydict()
    assert len(t["cached_tokens"]) > 0 and set(t["cached_tokens"]) == {0}


def test_run_keys_narrow_take_seeds_asked_for_and_reject_unknown_arms(tiny_spec):
    assert [k.run_id for k in run_keys(tiny_spec, [2])] == ["base-s2", "burst-s2"]
    assert [k.run_id for k in run_keys(tiny_spec, [99], ["burst"])] == ["burst-s99"]  # the spec's seeds: a default
    with pytest.raises(ValueError, match="no arm 'brust'"):
        run_keys(tiny_spec, [2], ["brust"])


def test_crashed_run_keeps_flushed_rows(tmp_path):
    rec = RunRecorder(tmp_path, "r", "arm", 1, flush_interval_s=60)
    for i in range(5):
        rec.turn(i, 0, False, "synthetic", 1.0, 1.0, 2.0, 3.0, 100, 0, 10, 0, None)
    rec.maybe_flush(61.0)  # a part file is on disk now
    rec.turn(9, 0, False, "synthetic", 70.0, 70.0, 71.0, 72.0, 100, 0, 10, 0, None)
    # the process dies here: no close(); recovery merges what was flushed
    assert merge_parts(tmp_path)
    t = pq.read_table(tmp_path / "turns.parquet")
    assert t.column("session_id").to_pylist() == [0, 1, 2, 3, 4]
    assert pq.read_table(tmp_path / "samples.parquet").num_rows == 0


def _flushed_turns(tmp_path, num_flushes):
    """A recorder that flushed ``num_flushes`` times, one turn (session i) a flush, and died."""
    rec = RunRecorder(tmp_path, "r", "arm", 1, flush_interval_s=60)
    for i in range(num_flushes):
        rec.turn(i, 0, False, "synthetic", 1.0, 1.0, 2.0, 3.0, 100, 0, 10, 0, None)
        rec.maybe_flush(61.0 * (i + 1))
    return rec


def test_every_flush_appends_to_one_stream_per_table_and_closing_merges_them(tmp_path):
    rec = _flushed_turns(tmp_path, 12)
    # samples and sessions had no rows to flush
    assert [p.name for p in (tmp_path / PARTS_DIR).iterdir()] == ["turns-stream.arrows"]
    rec.close()
    assert pq.read_table(tmp_path / "turns.parquet").column("session_id").to_pylist() == list(range(12))
    assert not (tmp_path / PARTS_DIR).exists()


def test_recovery_drops_the_batch_a_crash_cut_short_and_keeps_the_ones_before(tmp_path):
    _flushed_turns(tmp_path, 5)
    stream = tmp_path / PARTS_DIR / "turns-stream.arrows"
    data = stream.read_bytes()
    stream.write_bytes(data[:-40])  # the last flush's batch, half written
    assert merge_parts(tmp_path)
    assert pq.read_table(tmp_path / "turns.parquet").column("session_id").to_pylist() == [0, 1, 2, 3]


def test_recovery_reads_an_empty_stream_as_no_rows_and_refuses_one_it_cannot_read(tmp_path):
    parts = tmp_path / PARTS_DIR
    parts.mkdir()
    (parts / "turns-stream.arrows").write_bytes(b"")  # the run died as it opened it
    assert merge_parts(tmp_path)
    assert pq.read_table(tmp_path / "turns.parquet").num_rows == 0
    parts.mkdir()
    (parts / "turns-stream.arrows").write_bytes(b"not an arrow stream at all")
    with pytest.raises(pa.ArrowInvalid):
        merge_parts(tmp_path)


def test_recovery_merges_the_parts_of_runs_written_by_earlier_versions_in_order(tmp_path):
    # one Arrow IPC file per flush (parts 0-11: their order is the number's, not the name's), and
    # before those one Parquet file per flush
    rows = _flushed_turns(tmp_path / "src", 12)
    rows.close()
    table = pq.read_table(tmp_path / "src" / "turns.parquet")
    parts = tmp_path / PARTS_DIR
    parts.mkdir()
    for i in range(12):
        part = parts / f"turns-{i:05d}.arrow"
        if i in (3, 11):
            pq.write_table(table.slice(i, 1), part.with_suffix(".parquet"))
        else:
            with pa.OSFile(str(part), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table.slice(i, 1))
    assert merge_parts(tmp_path)
    assert pq.read_table(tmp_path / "turns.parquet").column("session_id").to_pylist() == list(range(12))
    assert not parts.exists()


def test_a_background_writer_writes_every_part_in_order_and_a_failed_write_is_raised(tmp_path):
    with ThreadPoolExecutor(max_workers=1) as writer:
        rec = RunRecorder(tmp_path, "r", "arm", 1, flush_interval_s=10, writer=writer)
        for i in range(30):
            rec.turn(i, 0, False, "synthetic", 1.0, 1.0, 2.0, 3.0, 100, 0, 10, 0, None)
            rec.maybe_flush(float(i))  # a part every 10 s
        rec.close()
    assert pq.read_table(tmp_path / "turns.parquet").column("session_id").to_pylist() == list(range(30))

    def fail(*args):
        raise OSError("No space left on device")

    class Failing(ThreadPoolExecutor):
        def submit(self, fn, *args):
            return super().submit(fail, *args)

    with Failing(max_workers=1) as writer:
        rec = RunRecorder(tmp_path / "full", "r", "arm", 1, flush_interval_s=10, writer=writer)
        rec.turn(0, 0, False, "synthetic", 1.0, 1.0, 2.0, 3.0, 100, 0, 10, 0, None)
        with pytest.raises(OSError, match="No space left"):
            rec.close()


def _controlled_spec(controller: dict):
    """Busy enough that sessions pile up during a burst, before control starts at 120 s."""
    data = make_spec_dict()
    data["workload"]["arrival_rate_per_s"] = 0.1
    data["arms"] = [{"name": "ctl", "controller": controller,
                     "triggers": [{"kind": "burst", "extra_rate_factor": 3.0, "start_s": 0, "duration_s": 120}]}]
    return parse_spec(data)


def test_session_cap_run_records_admitted_parked_waiting_and_the_limit(tmp_path):
    spec = _controlled_spec({"name": "session-cap", "params": {"k": 2, "k_hi": 3}, "start_s": 120})
    info = run_simulated(spec, RunKey("ctl", 1), tmp_path)
    s = pq.read_table(tmp_path / "runs" / "ctl-s1" / "samples.parquet").to_pydict()
    for i, t in enumerate(s["t_s"]):
        assert s["sessions_admitted"][i] == (s["sessions_in_system"][i] - s["sessions_gateway_waiting"][i]
                                             - s["sessions_parked"][i])
        assert s["gateway_limit"][i] == 2.0 if t >= 120 else np.isnan(s["gateway_limit"][i])
        if t >= 180:  # a minute after switch-on every session has been at a turn boundary
            assert s["sessions_admitted"][i] <= 3
    assert max(s["sessions_admitted"][:12]) > 3  # before control the crowd was let in
    assert max(s["sessions_gateway_waiting"]) > 0  # parks here are shorter than a sample interval

    sessions = pq.read_table(tmp_path / "runs" / "ctl-s1" / "sessions.parquet").to_pydict()
    assert len(sessions["session_id"]) == info["counts"]["sessions_arrived"]
    assert sessions["status"].count("completed") == info["counts"]["sessions_completed"]
    assert sum(sessions["num_parks"]) > 0
    turns = _turns(tmp_path, "ctl-s1").to_pydict()
    waits = {(sid, k): w for sid, k, w in zip(turns["session_id"], turns["turn_index"], turns["gateway_wait_s"])}
    for sid, arrival, admit, status, done in zip(sessions["session_id"], sessions["arrival_s"],
                                                 sessions["first_admit_s"], sessions["status"],
                                                 sessions["turns_completed"]):
        if (sid, 0) in waits:
            assert waits[(sid, 0)] == pytest.approx(admit - arrival)
        assert (status == "in_system") == (done < 6)
    assert any(k > 0 and w > 0 for k, w in zip(turns["turn_index"], turns["gateway_wait_s"]))  # a parked turn


@pytest.mark.parametrize("name", ["admission-only", "adaptive-cap", "aimd", "budgeter"])
def test_every_limit_runs_deterministically_and_finishes_what_it_admits(tmp_path, name):
    spec = _controlled_spec({"name": name, "start_s": 120})
    for out in ("a", "b"):
        run_simulated(spec, RunKey("ctl", 2), tmp_path / out)
    for table in ("turns", "samples", "sessions"):
        a = (tmp_path / "a" / "runs" / "ctl-s2" / f"{table}.parquet").read_bytes()
        assert a == (tmp_path / "b" / "runs" / "ctl-s2" / f"{table}.parquet").read_bytes()
    sessions = pq.read_table(tmp_path / "a" / "runs" / "ctl-s2" / "sessions.parquet").to_pydict()
    finished_by = [f for f, st in zip(sessions["finish_s"], sessions["status"]) if st == "completed"]
    assert len(finished_by) > 0.8 * len(sessions["status"])
