"""examples/torch_publish_pull.py end to end, reduced: a trainer publishing
every step and two worker processes following it; the example itself
checks that the workers end bit-identical to model.to(torch.bfloat16)."""
import os
import subprocess
import sys

from _harness import ROOT, Skip, run

import ferry


def test_example_reduced():
    if not hasattr(ferry, "Publisher"):
        raise Skip("this libferry has no sync layer")
    ex = os.path.join(ROOT, "examples", "torch_publish_pull.py")
    r = subprocess.run([sys.executable, ex, "--steps", "6", "--workers", "2", "--anchor-every", "4"],
                       capture_output=True, text=True, timeout=300)
    print(r.stdout[-3000:], r.stderr[-3000:])
    assert r.returncode == 0, r.returncode
    assert r.stdout.count("bit for bit: yes") == 2
    assert "7 versions of" in r.stdout


if __name__ == "__main__":
    run("example", [test_example_reduced])
