"""The README's Python examples run as written."""
import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_readme_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 3
    namespace = {}
    for block in blocks:          # later examples may use names from earlier ones
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["y"].shape == (512, 256)
    assert set(namespace["grads"]) >= {"x", "router_weights", "w0", "w1", "wo"}
