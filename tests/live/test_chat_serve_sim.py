"""Chat mode end to end: real HTTP to a serve-sim process that tokenizes chat messages."""

import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from loadgen.core.runner import RunKey, run_simulated
from loadgen.core.spec import parse_spec
from loadgen.live.runner import run_live
from tests.conftest import make_spec_dict
from tests.live.small_tokenizer import build_tokenizer
from tests.live.test_live_serve_sim import TIME_SCALE, live_spec

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=3000)


def rows(out, run_id="base-s3"):
    t = pq.read_table(out / "runs" / run_id / "turns.parquet").to_pydict()
    keys = ("session_id", "turn_index", "prompt_tokens", "cached_tokens", "planned_prompt_tokens",
            "retokenization_drift_tokens", "error")
    return [dict(zip(keys, values)) for values in zip(*(t[k] for k in keys))]


def prompt_and_cached(rows_):
    return {(r["session_id"], r["turn_index"]): (r["prompt_tokens"], r["cached_tokens"]) for r in rows_}


@pytest.mark.parametrize("api", ["chat", "completions-text"])
def test_a_text_run_records_the_same_cached_tokens_turn_by_turn_as_virtual_time(tmp_path, serve_sim_factory,
                                                                                  tok_dir, api):
    if api == "chat":
        server = serve_sim_factory(TIME_SCALE, "--tokenizer", str(tok_dir), "--chat-only")
        sim_spec, spec = live_spec(server.url, api="chat", tokenizer=str(tok_dir))
    else:  # the completions API's text prompts, built with the same tokenizer path
        server = serve_sim_factory(TIME_SCALE, "--tokenizer", str(tok_dir))
        sim_spec, spec = live_spec(server.url, prompt_mode="text", tokenizer=str(tok_dir))
    info = run_live(spec, RunKey("base", 3), tmp_path / "live")
    assert info["status"] == "completed", info.get("error")
    assert info["preflight"]["api"] == api.split("-")[0] and info["preflight"]["prompt_lengths"]["exact"]
    run_simulated(sim_spec, RunKey("base", 3), tmp_path / "virtual")
    live = [r for r in rows(tmp_path / "live") if r["error"] is None]
    # usage.prompt_tokens (the server's count of the templated messages) is the planned length,
    # and every returned text re-tokenized to the ids the server generated
    assert live and all(r["prompt_tokens"] == r["planned_prompt_tokens"] for r in live)
    assert all(r["retokenization_drift_tokens"] == 0 for r in live)
    virtual = prompt_and_cached(rows(tmp_path / "virtual"))
    live_by_turn = prompt_and_cached(live)
    common = set(live_by_turn) & set(virtual)
    assert len(common) >= 0.85 * len(virtual) > 20
    assert {k: live_by_turn[k] for k in common} == {k: virtual[k] for k in common}
    # and the cache really was hit: warm turns reuse the previous prompt and output
    assert sum(c for _, c in live_by_turn.values()) > 0.5 * sum(p for p, _ in live_by_turn.values())


def test_loadgen_run_drives_a_chat_only_endpoint_counting_with_its_tokenize(tmp_path, serve_sim_factory):
    # no tokenizer on either side: serve-sim counts words, the client asks its /tokenize
    server = serve_sim_factory(TIME_SCALE, "--chat-only")
    sim_spec, _ = live_spec(server.url)
    data = sim_spec.model_dump(mode="json", exclude_unset=True)
    data["engine"] = {"kind": "openai", "url": "http://127.0.0.1:1", "api": "chat"}
    data["time_scale"] = TIME_SCALE
    spec_path = tmp_path / "chat.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(spec_path), "--out", str(out),
                           "--endpoint", server.url, "--quiet", "--no-figures"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    live = [r for r in rows(out) if r["error"] is None]
    assert len(live) > 20 and all(r["prompt_tokens"] == r["planned_prompt_tokens"] for r in live)
    warm = [r for r in live if r["turn_index"] > 0]
    assert warm and all(r["cached_tokens"] > 0 for r in warm)
    import json

    summary = json.loads((out / "summary.json").read_text())
    (run,) = summary["runs"]
    assert run["retokenization_drift_tokens_total"] == 0 and run["prompt_tokens_off_plan_turns"] == 0


def test_a_completions_run_on_a_chat_only_endpoint_says_to_use_the_chat_api(tmp_path, serve_sim_factory):
    server = serve_sim_factory(TIME_SCALE, "--chat-only")
    sim_spec, _ = live_spec(server.url)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(sim_spec.model_dump(mode="json", exclude_unset=True)))
    done = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(spec_path), "--out", str(tmp_path / "o"),
                           "--endpoint", server.url, "--quiet", "--no-figures"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "/v1/completions answered HTTP 404" in done.stderr and "--api chat" in done.stderr


@pytest.mark.parametrize("api, preset", [("chat", "tree-search"), ("chat", "parallel-tools"),
                                         ("completions-text", "tree-search")])
def test_a_text_run_of_session_trees_resends_the_parents_conversation_and_hits_where_virtual_time_hits(
        tmp_path, serve_sim_factory, tok_dir, api, preset):
    """A fork's first request is its parent's messages as sent, the text the server returned as the
    assistant's message, then its own user message (a parallel call: its turn's messages, then its
    own): serve-sim's chat template renders the parent's prefix, so the fork hits the parent's blocks."""
    extra = ("--chat-only",) if api == "chat" else ()
    server = serve_sim_factory(TIME_SCALE, "--tokenizer", str(tok_dir), *extra)
    data = make_spec_dict(duration_s=240, seeds=[3])
    data["workload"] = {"arrival_rate_per_s": 0.03, "sessions": {"kind": "tree", "preset": preset}}
    data["arms"] = [{"name": "base"}]
    sim_spec = parse_spec({**data, "engine": {"kind": "sim", "pool_tokens": 400000}})
    engine = {"api": "chat"} if api == "chat" else {"prompt_mode": "text"}
    spec = parse_spec({**data, "engine": {"kind": "openai", "url": server.url, "tokenizer": str(tok_dir), **engine},
                       "time_scale": TIME_SCALE})
    info = run_live(spec, RunKey("base", 3), tmp_path / "live")
    assert info["status"] == "completed", info.get("error")
    assert info["preflight"]["prompt_lengths"]["exact"]
    run_simulated(sim_spec, RunKey("base", 3), tmp_path / "virtual")
    live = [r for r in rows(tmp_path / "live") if r["error"] is None]
    assert all(r["prompt_tokens"] == r["planned_prompt_tokens"] for r in live)
    virtual = prompt_and_cached(rows(tmp_path / "virtual"))
    live_by_turn = prompt_and_cached(live)
    common = set(live_by_turn) & set(virtual)
    assert len(common) >= 0.8 * len(virtual) > 20
    assert all(live_by_turn[k][0] == virtual[k][0] for k in common)  # exact prompt lengths
    children = [k for k in common if k[0] >= 1 << 40 and k[1] == 0]
    assert len(children) > 5 and sum(virtual[k][1] for k in children) > 0
    # every turn hits as in virtual time; a child's first turn may differ by one block where the
    # chat template's tokens between two messages cross a block boundary (a sibling fork shares
    # the assistant message's end and the next header; a parallel call lacks the generation prompt)
    block = info["preflight"]["block_size"]
    slack = block if api == "chat" else 0
    assert all(live_by_turn[k] == virtual[k] for k in common if k not in children)
    assert all(abs(live_by_turn[k][1] - virtual[k][1]) <= slack for k in children)
    assert sum(live_by_turn[k] == virtual[k] for k in children) >= 0.9 * len(children)
