"""docs/writing-a-backend.md is enough to write a generating backend: its two files, taken from the page as they are,
make a distribution that exports ``task="text-generation"`` and generates the same token ids as transformers."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

from plugin_path import write_distribution

PAGE = Path(__file__).parents[2] / "docs" / "writing-a-backend.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_the_pages_backend_exports_text_generation_and_generates_token_exact(tmp_path):
    source = tmp_path / "hfexport-pt2gen"
    (source / "src" / "hfexport_pt2gen").mkdir(parents=True)
    [pyproject] = _blocks("toml")
    (source / "pyproject.toml").write_text(pyproject)
    (source / "src" / "hfexport_pt2gen" / "__init__.py").write_text(_blocks("python")[0])
    site = tmp_path / "site"
    site.mkdir()
    assert write_distribution(source, site) == "hfexport-pt2gen"
    script = textwrap.dedent("""
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        import hfexport

        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=64)).eval()
        assert "pt2gen" in [b.name for b in hfexport.list_backends()]
        exported = hfexport.export(model, backend="pt2gen", task="text-generation", max_cache_len=32)
        prompt = torch.tensor([[5, 17, 3, 99, 42]])
        ids = exported.generate(prompt, max_new_tokens=8)
        expected = model.generate(prompt, max_new_tokens=8, do_sample=False, min_new_tokens=8)
        print("ids", ids.tolist(), expected.tolist())
        assert ids.tolist() == expected.tolist()
        assert exported.manifest["backend"] == "pt2gen" and exported.manifest["task"] == "text-generation"
    """)
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "ids [[5, 17, 3, 99, 42" in out.stdout
