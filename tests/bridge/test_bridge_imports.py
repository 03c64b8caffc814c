"""The trainer side does not need vLLM or SGLang: importing the bridge must not import them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bridge_imports_without_vllm_or_sglang():
    code = (
        "import sys\n"
        "import grrm_client, trainer_bridge, trainer_bridge.config, trainer_bridge.rewards\n"
        "import trainer_bridge.rollout, trainer_bridge.metrics, trainer_bridge.batch\n"
        "light = sorted(m for m in ('vllm', 'sglang', 'ray', 'verl') if m in sys.modules)\n"
        "import importlib.util\n"
        "if importlib.util.find_spec('orjson'):  # verl's reward loop needs it (requirements/dev.txt)\n"
        "    import trainer_bridge.reward_manager\n"
        "heavy = sorted(m for m in ('vllm', 'sglang') if m in sys.modules)\n"
        "print(light, heavy)\n"
    )
    # A poisoned vllm / sglang on the path: any import of them fails loudly.
    poison = REPO / "build" / "poisoned-imports"
    poison.mkdir(parents=True, exist_ok=True)
    for name in ("vllm", "sglang"):
        (poison / f"{name}.py").write_text(f"raise ImportError('the trainer bridge must not import {name}')\n")
    env_path = [str(poison), *sys.path]
    result = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path[:0] = {env_path!r}\n{code}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[] []"
