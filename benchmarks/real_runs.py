"""The real GPU runs of a folder laid out as ../data/gpu is (README there), each mapped onto a
simulated replay, or listed with why it cannot be (sim_to_real.py runs them).

Sources and how each maps (docs/sim-to-real.md says the same for users):

- ``llmservingsim/bench/examples/<GPU>/<model>/``: vLLM AsyncLLM replays of a workload file. The
  replay is that file on its own clock (format llmservingsim); the measured times are read from
  vllm/requests.jsonl against ``queued_ts``; the step costs come from the model's kernel profile
  (``profiler/perf/<GPU>/<model>/bf16/tp<N>``) plus host time per step read from one run's decode-only
  seconds (``HOST_RUN``: that run is ``fit``, the others ``validation``). A data-parallel run is not
  mapped (a replay on a simulated deployment is refused).
- ``blis-training/default_args/<run>/``: inference-perf ``shared_prefix`` runs over HTTP. The workload
  is regenerated as inference-perf's generator builds it (``inference_perf_trace``) from the settings
  it echoed (results_config_yaml in workloads.json); stages of constant rate x duration.
- ``blis-sim-to-real/results_trainval``: runs of the same generator whose settings are in
  ``blis/testdata/trained_physics_iter29.json`` (workload, max_num_seqs, KV blocks).
- ``blis-sim-to-real/results_iter36``: the same study's runs named ``<id>-<model>-tp<N>-<profile>...``;
  the workload is the one every recorded run of that profile used (``PROFILES``); the KV pool is
  what vLLM's memory budget leaves (roofline.kv_pool_tokens).
- ``llm-d/benchmarks/traces``: not mapped (no send times, no output lengths; see ``UNMAPPED_LLMD``).
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Optional

import numpy as np
import yaml

from loadgen.analysis.latency import nearest_rank
from loadgen.sim.host_time import read_requests
from roofline import Architecture, Hardware, Roofline, architecture, kv_pool_tokens, load_architecture, load_hardware, overhead_bytes

BLOCK_TOKENS = 16  # vLLM's default block size (none of these runs sets another)
GPU_MEMORY_UTILIZATION = 0.9  # every run that records it
CLIENT_TIMEOUT_S = 300.0  # inference-perf's HTTP client: every failed request of the collapsed runs ends at 300 s
# a run whose queue grew for its whole length (the four reasoning runs: mean TTFT 103-120 s; every
# other training run under 0.2 s)
COLLAPSED_TTFT_MS = 60_000.0
HOST_RUN = "RTXPRO6000/Llama-3.1-8B"  # the LLMServingSim run whose decode-only seconds give the host time
UNMAPPED_LLMD = ("per-request samples without send times or output lengths; two replicas behind llm-d's "
                 "latency-predicting EPP; max_num_seqs, max_num_batched_tokens and the KV pool not recorded")

# inference-perf shared_prefix profiles of the BLIS study, as every run that echoes its settings has them:
# (system_prompt_len, question_len, output_len, stages [(rate req/s, duration s)])
PROFILES = {
    "general": (100, 447, 248, ((8.0, 600), (20.0, 600))),
    "general-lite": (100, 447, 248, ((2.5, 600), (6.0, 600))),
    "codegen": (100, 466, 247, ((5.0, 600), (10.0, 600))),
    "roleplay": (150, 600, 251, ((6.0, 1200),)),
    "reasoning": (100, 934, 1448, ((4.0, 1200),)),
    "reasoning-lite": (100, 934, 1448, ((1.0, 1200),)),
}
METRICS = ("ttft_mean", "ttft_p90", "ttft_p99", "e2e_mean", "e2e_p90", "e2e_p99", "tpot_mean", "request_throughput")


@dataclass
class SharedPrefix:
    """inference-perf's shared_prefix data: groups of prompts that share a system prompt."""

    system_prompt_tokens: int
    question_tokens: int
    output_tokens: int
    num_groups: int
    prompts_per_group: int
    stages: tuple  # ((rate_per_s, duration_s), ...)


@dataclass
class Mapping:
    engine: dict  # the sim engine's spec fields
    gpu: str
    tp: int
    roofline: Optional[Roofline] = None  # cost from the roofline fit
    profile_dir: Optional[Path] = None  # cost from a kernel profile
    # the tensor-parallel all-reduces a profile taken on one GPU leaves out: (seconds a step, seconds a
    # token), from the run's recorded interconnect
    allreduce: tuple = (0.0, 0.0)
    num_layers: int = 0
    trace_path: Optional[Path] = None  # a recorded workload file (llmservingsim format)
    shared_prefix: Optional[SharedPrefix] = None  # a generated inference-perf workload
    over_http: bool = False  # measured by an HTTP client (request overhead outside the engine)
    notes: list = field(default_factory=list)


@dataclass
class RealRun:
    name: str
    source: str  # LSS, TRN, S2R-tv, S2R-36, LLMD
    split: str  # fit / validation
    gpu: str
    model: str
    measured: dict  # METRICS in ms (throughput in tokens/s), None where not recorded
    mapping: Optional[Mapping] = None
    unmapped: Optional[str] = None  # why not, when mapping is None
    failed: Optional[int] = None
    collapsed: bool = False
    notes: list = field(default_factory=list)  # how the mapping filled what the run does not record
    stage_means_s: tuple = ()  # per load stage, measured (mean TTFT, mean E2E), where the run records them


def stats_ms(values_s: np.ndarray, prefix: str) -> dict:
    """Mean, p90 and p99 in ms, nearest rank as the serving table takes them (the METRICS names)."""
    ms = np.asarray(values_s, dtype=float) * 1e3
    return {f"{prefix}_mean": float(ms.mean()), f"{prefix}_p90": nearest_rank(ms, 0.9),
            f"{prefix}_p99": nearest_rank(ms, 0.99)}


def _lss_runs(data: Path) -> list[RealRun]:
    root = data / "llmservingsim"
    runs = []
    for meta_path in sorted((root / "bench" / "examples").glob("*/*/vllm/meta.json")):
        run_dir = meta_path.parent.parent
        name = f"{run_dir.parent.name}/{run_dir.name}"
        meta = json.loads(meta_path.read_text())
        kw = meta["engine_kwargs"]
        reqs = read_requests(meta_path.parent / "requests.jsonl")
        queued = np.array([r["queued_ts"] for r in reqs])
        first = np.array([r["first_token_ts"] for r in reqs])
        last = np.array([r["last_token_ts"] for r in reqs])
        out = np.array([r["output_toks"] for r in reqs])
        measured = {**stats_ms(first - queued, "ttft"), **stats_ms(last - queued, "e2e"),
                    "tpot_mean": float(np.mean((last - first) / np.maximum(1, out - 1))) * 1e3,
                    "request_throughput": len(reqs) / float(last.max() - queued.min())}
        run = RealRun(name, "LSS", "fit" if name == HOST_RUN else "validation", run_dir.parent.name,
                      meta["model"], measured)
        runs.append(run)
        tp, dp = kw.get("tensor_parallel_size", 1), kw.get("data_parallel_size", 1)
        if dp != 1:
            run.unmapped = (f"data_parallel_size {dp}: {dp} engines behind a load balancer, and a replay on a "
                            f"simulated deployment is refused")
            continue
        cfg = json.loads((run_dir / "config.json").read_text())["nodes"][0]["instances"][0]
        arch_cfg = json.loads((root / "configs" / "model" / f"{meta['model']}.json").read_text())
        arch = architecture(meta["model"], arch_cfg)
        hw = Hardware(cfg["hardware"], 0.0, 0.0, cfg["npu_mem"]["mem_bw"] * 1e9, cfg["npu_mem"]["mem_size"] * 2**30)
        allreduce = (0.0, 0.0)
        if tp > 1:  # 2 per layer, each a ring over the link LLMServingSim's config records for the run
            link = json.loads((run_dir / "config.json").read_text())
            hops = 2 * arch.shape.num_layers
            allreduce = (hops * link["link_latency"] * 1e-9,
                         hops * 2 * (tp - 1) / tp * arch.shape.hidden_size * 2 / (link["link_bw"] * 1e9))
            run.notes.append(f"tensor-parallel all-reduce from the run's link ({link['link_bw']} GB/s, "
                             f"{link['link_latency'] / 1e3:g} us): the kernel profile was taken on one GPU")
        run.mapping = Mapping(
            allreduce=allreduce,
            engine={"max_num_seqs": kw["max_num_seqs"], "max_num_batched_tokens": kw["max_num_batched_tokens"],
                    "pool_tokens": kv_pool_tokens(arch, hw, tp, cfg["npu_mem"].get("mem_util", GPU_MEMORY_UTILIZATION),
                                                  0.0)},
            gpu=run.gpu, tp=tp, profile_dir=root / "profiler" / "perf" / run.gpu / meta["model"] / "bf16",
            num_layers=arch.shape.num_layers, trace_path=_workload(root, meta, run.notes),
            notes=run.notes)
        run.notes.append("KV pool not recorded: vLLM's budget (mem_size x mem_util - weights)")
    return runs


def _workload(root: Path, meta: dict, notes: list) -> Path:
    """The run's workload file, or the file with its recorded sha256 (a copy kept once under another name)."""
    path = root / meta["dataset_path"]
    if not path.is_file():
        for other in sorted((root / "workloads").glob("*.jsonl")):
            if hashlib.sha256(other.read_bytes()).hexdigest() == meta.get("dataset_hash"):
                notes.append(f"workload {path.name}: the byte-identical {other.name} (same sha256)")
                return other
    return path


def _trn_stage_means_s(results: Path, num_stages: int) -> tuple:
    means = []
    for i in range(num_stages):
        lat = json.loads((results / f"stage_{i}_lifecycle_metrics.json").read_text())["successes"]["latency"]
        means.append((lat["time_to_first_token"]["mean"], lat["request_latency"]["mean"]))
    return tuple(means)


def _trn_measured(results: Path, output_tokens: int) -> tuple[dict, int]:
    summary = json.loads((results / "summary_lifecycle_metrics.json").read_text())
    lat = summary["successes"]["latency"]
    measured = {}
    for key, name in (("time_to_first_token", "ttft"), ("request_latency", "e2e")):
        for stat, suffix in (("mean", "mean"), ("p90", "p90"), ("p99", "p99")):
            measured[f"{name}_{suffix}"] = lat[key][stat] * 1e3
    # inference-perf's per-token fields are per streamed chunk (README of the data); the per-token time
    # is derived from the means, as it is for the runs that recorded no more than means
    measured["tpot_mean"] = (measured["e2e_mean"] - measured["ttft_mean"]) / (output_tokens - 1)
    # requests, not tokens: inference-perf counts output tokens by tokenizing the text again
    measured["request_throughput"] = summary["successes"]["throughput"]["requests_per_sec"]
    return measured, int(summary["failures"]["count"])


def _s2r_measured(path: Path) -> dict[str, dict]:
    by_run: dict[str, dict] = {}
    for row in csv.DictReader(path.open()):
        if row["stage_index"] == "-1" and row["metric_name"] != "itl_mean":
            by_run.setdefault(row["experiment"], {"_row": row})[row["metric_name"]] = float(row["actual_ms"])
    return by_run


def _profile_of(name: str) -> Optional[str]:
    m = re.search(r"-tp\d+-([a-z]+(?:-lite)?)", name)
    return m.group(1) if m and m.group(1) in PROFILES else None


class _Memory:
    """vLLM's KV budget: the activation overhead a pool needs, from runs that recorded their pool."""

    def __init__(self):
        self.samples: list[float] = []

    def record(self, arch: Architecture, hw: Hardware, tp: int, pool_tokens: int) -> None:
        if arch.weight_bytes_per_param == 2.0:  # the FP8 model keeps some layers in bf16 (no parameter count for them)
            self.samples.append(overhead_bytes(arch, hw, tp, GPU_MEMORY_UTILIZATION, pool_tokens))

    def pool(self, arch: Architecture, hw: Hardware, tp: int) -> int:
        return kv_pool_tokens(arch, hw, tp, GPU_MEMORY_UTILIZATION, median(self.samples))


def discover(data: Path) -> list[RealRun]:
    """Every run of ``data``, mapped or with the reason it is not."""
    blis = data / "blis"
    hw_path = blis / "hardware_config.json"
    runs = _lss_runs(data) if (data / "llmservingsim").is_dir() else []
    iter29 = {}
    if (blis / "testdata" / "trained_physics_iter29.json").is_file():
        iter29 = {e["id"]: e for e in json.loads((blis / "testdata" / "trained_physics_iter29.json").read_text())["experiments"]}
    memory = _Memory()
    for e in iter29.values():
        arch, hw = load_architecture(blis / "model_configs", e["model"]), load_hardware(hw_path, e["hardware"])
        if arch and hw:
            memory.record(arch, hw, e["tp"], e["total_kv_blocks"] * BLOCK_TOKENS)
    pending: list[tuple[RealRun, dict]] = []  # (run, settings) mapped once every pool sample is in

    trn_root = data / "blis-training" / "default_args"
    trn_names = {}
    if (trn_root / "workloads.json").is_file():
        workloads = json.loads((trn_root / "workloads.json").read_text())
        for run_dir in sorted(p for p in trn_root.iterdir() if (p / "exp-config.yaml").is_file()):
            exp = yaml.safe_load((run_dir / "exp-config.yaml").read_text())
            echo = workloads[run_dir.name]["results_config_yaml"]
            sp = echo["data"]["shared_prefix"]
            measured, failed = _trn_measured(run_dir / "results", sp["output_len"])
            stages = tuple((s["rate"], s["duration"]) for s in echo["load"]["stages"])
            run = RealRun(run_dir.name, "TRN", "fit", "H100", exp["model"], measured, failed=failed,
                          collapsed=measured["ttft_mean"] > COLLAPSED_TTFT_MS,
                          stage_means_s=_trn_stage_means_s(run_dir / "results", len(stages)))
            if run.collapsed:
                run.split = "validation"  # overloaded: left out of the fit, as BLIS leaves them
            trn_names[run_dir.name[:15]] = run.name
            blocks = (iter29.get(run_dir.name[:15]) or {}).get("total_kv_blocks")
            prefix = SharedPrefix(sp["system_prompt_len"], sp["question_len"], sp["output_len"], sp["num_groups"],
                                  sp["num_prompts_per_group"], stages)
            pending.append((run, {"tp": exp["tensor_parallelism"], "max_num_seqs": exp["max_num_seqs"],
                                  "max_num_batched_tokens": exp["max_num_batched_tokens"],
                                  "max_model_len": exp["max_model_len"], "blocks": blocks, "prefix": prefix}))
            runs.append(run)

    s2r = data / "blis-sim-to-real"
    for folder, source in (("results_trainval", "S2R-tv"), ("results_iter36", "S2R-36")):
        path = s2r / folder / "measured_actuals.csv"
        if not path.is_file():
            continue
        for name, values in _s2r_measured(path).items():
            row = values.pop("_row")
            exp_id = row["exp_id"]
            twin = trn_names.get(name[:15]) if name[:8].isdigit() else None
            if twin is None and source == "S2R-36":
                twin = next((t for t in trn_names.values() if _same_measurement(values, runs, t)), None)
            if twin is not None:
                runs.append(RealRun(name, source, "fit", row["hardware"], row["model"], {},
                                    unmapped=f"the same measurement as {twin} (mapped there)"))
                continue
            measured = dict(values)
            run = RealRun(name, source, "validation", row["hardware"], row["model"], measured)
            runs.append(run)
            e = iter29.get(exp_id) if source == "S2R-tv" else None
            if e is not None:
                sp = e["workload"]["inference_perf"]["shared_prefix"]
                prefix = SharedPrefix(sp["system_prompt_len"], sp["question_len"], sp["output_len"],
                                      sp["num_unique_system_prompts"], sp["num_users_per_system_prompt"],
                                      tuple((s["rate"], s["duration"]) for s in e["workload"]["inference_perf"]["stages"]))
                settings = {"tp": e["tp"], "max_num_seqs": e["max_num_seqs"],
                            "max_num_batched_tokens": e["max_num_batched_tokens"], "blocks": e["total_kv_blocks"]}
            else:
                profile = _profile_of(name)
                if profile is None:
                    run.unmapped = f"the workload profile of {name!r} is not one of {sorted(PROFILES)}"
                    continue
                s, q, o, stages = PROFILES[profile]
                prefix = SharedPrefix(s, q, o, 10, 10, stages)
                settings = {"tp": int(row["tp"]), "max_num_seqs": 128,
                            "max_num_batched_tokens": int(row["max_num_batched_tokens"]), "blocks": None}
                run.notes = [f"workload: the {profile!r} profile as every run that records it",
                             "max_num_seqs 128 as every run of the study that records it"]
            measured["tpot_mean"] = (measured["e2e_mean"] - measured["ttft_mean"]) / (prefix.output_tokens - 1)
            measured["request_throughput"] = None
            if row["cpu_offload"] == "True" or (e is not None and e.get("cpu_kv_blocks")):
                settings["offload_note"] = True
            pending.append((run, {**settings, "prefix": prefix, "max_model_len": 32768}))

    for run, st in pending:
        arch = load_architecture(blis / "model_configs", run.model)
        hw = load_hardware(hw_path, run.gpu.split(" ")[0])
        if arch is None:
            run.unmapped = f"no architecture for {run.model} (blis/model_configs)"
            continue
        if hw is None:
            run.unmapped = f"no peak FLOP/s and bandwidth for {run.gpu} (blis/hardware_config.json)"
            continue
        tp = st["tp"]
        pool = st["blocks"] * BLOCK_TOKENS if st.get("blocks") else memory.pool(arch, hw, tp)
        notes = run.notes
        if not st.get("blocks"):
            notes.append(f"KV pool not recorded: {pool} tokens from vLLM's budget (median activation overhead "
                         f"of the runs that record their pool)")
        if st.get("offload_note"):
            notes.append("CPU KV offload configured: not simulated (prompts recur within the GPU pool)")
        run.mapping = Mapping(
            engine={"max_num_seqs": st["max_num_seqs"], "max_num_batched_tokens": st["max_num_batched_tokens"],
                    "pool_tokens": pool, "max_model_len": st["max_model_len"]},
            gpu=run.gpu, tp=tp, roofline=Roofline.of(arch, hw, tp), shared_prefix=st["prefix"], over_http=True,
            notes=notes)

    llmd = data / "llm-d" / "benchmarks" / "traces"
    for path in sorted(llmd.glob("*.jsonl")) if llmd.is_dir() else []:
        runs.append(RealRun(path.name, "LLMD", "validation", "H200", "Qwen/Qwen3-32B", {}, unmapped=UNMAPPED_LLMD))
    return runs


def _same_measurement(values: dict, runs: list[RealRun], name: str) -> bool:
    """iter36 relabels some training runs: the same TTFT and E2E means (to 1e-6) are the same run."""
    twin = next(r for r in runs if r.name == name)
    return all(abs(values.get(k, -1) - twin.measured[k]) < 1e-6 * max(1.0, twin.measured[k]) for k in ("ttft_mean", "e2e_mean"))


def inference_perf_trace(prefix: SharedPrefix, seed: int) -> list[dict]:
    """The requests inference-perf's shared_prefix generator sends, as Mooncake rows: num_groups
    system prompts of system_prompt_tokens, each with prompts_per_group questions of question_tokens;
    request i takes prompt i mod (groups x prompts) of a seeded shuffle; ``output_tokens`` exactly
    (ignore_eos); each stage sends at constant intervals of 1/rate. A hash id stands for one 16-token
    block: the system prompt's whole blocks are its group's, the rest the prompt's own."""
    rng = np.random.default_rng(seed)
    total = prefix.system_prompt_tokens + prefix.question_tokens
    num_blocks = -(-total // BLOCK_TOKENS)
    shared = prefix.system_prompt_tokens // BLOCK_TOKENS
    prompts = []
    for g in range(prefix.num_groups):
        for p in range(prefix.prompts_per_group):
            own = 1_000_000 + (g * prefix.prompts_per_group + p) * num_blocks
            prompts.append([g * shared + j for j in range(shared)] + [own + j for j in range(num_blocks - shared)])
    order = rng.permutation(len(prompts))
    rows, t0_s, i = [], 0.0, 0
    for rate, duration in prefix.stages:
        for k in range(int(round(rate * duration))):
            rows.append({"timestamp": round((t0_s + k / rate) * 1e3, 6), "input_length": total,
                         "output_length": prefix.output_tokens, "hash_ids": prompts[order[i % len(prompts)]]})
            i += 1
        t0_s += duration
    return rows
