"""The trainer side does not need vLLM or SGLang: importing the bridge must not import them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bridge_imports_without_vllm_or_sglang():
    code = (
        "import sys\n"
        "import grrm_client, trainer_bridge, grrm_client.adapters.verl.config, grrm_client.adapters.verl.extra_info\n"
        "import grrm_client.adapters.verl.rollout, grrm_client.adapters.verl.metrics, grrm_client.adapters.verl.batch\n"
        "light = sorted(m for m in ('vllm', 'sglang', 'ray', 'verl') if m in sys.modules)\n"
        "import importlib.util\n"
        "if importlib.util.find_spec('orjson'):  # verl's reward loop needs it (requirements/dev.txt)\n"
        "    import grrm_client.adapters.verl.reward_manager\n"
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
