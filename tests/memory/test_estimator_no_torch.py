"""The estimator is arithmetic: it imports and runs with torch (and numpy) unavailable."""

import subprocess
import sys

BLOCKED = '''
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "numpy"):
            raise ImportError(f"{name} is blocked")

sys.meta_path.insert(0, Block())
from memlab.memory.estimator import estimate, estimate_inference
from memlab.model import StepSpec

est = estimate(StepSpec("llama2-7b", batch_size=1, seq_len=2048, precision="bf16-mixed"))
print(est.peak_bytes, estimate_inference("tiny", 1, 16).peak_bytes)
'''


def test_estimator_imports_without_torch():
    proc = subprocess.run([sys.executable, "-c", BLOCKED], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    from memlab.memory.estimator import estimate, estimate_inference

    want = estimate("llama2-7b", batch_size=1, seq_len=2048, precision="bf16-mixed").peak_bytes
    assert proc.stdout.split() == [str(want), str(estimate_inference("tiny", 1, 16).peak_bytes)]
