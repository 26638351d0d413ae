"""``hfexport export --task image-text-to-text`` and ``hfexport generate --image``: the export copies the model's
processor files and checks its greedy generation with images against eager; ``generate`` reads images with Pillow,
preprocesses them with the model's own processor (from the artifact) and prints eager ``model.generate``'s ids, in a
new process. Usage errors exit 2 with one line (issue 28)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from helpers import tiny_model
from hfexport import cli

IMAGE_TOKEN = 99


def _processor():
    """The tiny LLaVA's processor, built offline: a word-level tokenizer (``<pad>`` 0, ``<s>`` 1, ``</s>`` 2,
    ``w3`` ... ``w98``, ``<image>`` 99) and a CLIP image processor to 32x32 (16 image tokens: 4x4 patches of 8)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import CLIPImageProcessor, LlavaProcessor, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, IMAGE_TOKEN)}, "<image>": IMAGE_TOKEN}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>",
                                        eos_token="</s>", unk_token="<pad>",
                                        extra_special_tokens={"image_token": "<image>"})
    images = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=8,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1)


def _image(path, seed: int, size: tuple[int, int]):
    import numpy as np
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((*size, 3)) * 255).astype("uint8")
    Image.fromarray(pixels).save(path)
    return path


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    """A tiny LlavaForConditionalGeneration's directory (weights, config, processor), two PNGs of other sizes than
    the model's 32x32, and ``export --task image-text-to-text --max-batch 2`` of it, in-process."""
    model = tiny_model("llava")
    root = tmp_path_factory.mktemp("llava")
    model.save_pretrained(root / "model")
    _processor().save_pretrained(root / "model")
    images = [_image(root / "a.png", 0, (40, 50)), _image(root / "b.png", 1, (64, 48))]
    code = cli.main(["export", str(root / "model"), "--task", "image-text-to-text", "--max-batch", "2",
                     "-o", str(root / "vlm")])
    assert code == 0
    return model, root / "model", root / "vlm", images


def test_export_copies_the_processor_and_checks_generation_with_images(llava):
    _, _, out, _ = llava
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["task"] == "image-text-to-text" and list(manifest["components"]) == ["vision", "embed", "decoder"]
    assert {"processor_config.json", "tokenizer.json"} <= set(manifest["files"])
    check = manifest["verification"]
    assert check["passed"] is True and check["first_difference"] is None
    assert check["inputs"]["pixel_values"] == [2, 3, 32, 32]  # the check ran with an image per row


def test_generate_with_images_in_a_new_process_equals_eager(llava):
    """Two prompts, the second without an image token (the processor's goes in front), left-padded by the
    processor; the PNGs are 40x50 and 64x48, resized to 32x32 by the model's own image processor."""
    from PIL import Image

    model, directory, out, images = llava
    prompts = ["w5 <image> w6 w7", "w8 w9"]
    run = subprocess.run([sys.executable, "-m", "hfexport.cli", "generate", str(out), "--prompt", prompts[0],
                          "--prompt", prompts[1], "--image", str(images[0]), "--image", str(images[1]),
                          "--max-new-tokens", "8", "--json"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)

    processor = _processor()
    processor.tokenizer.padding_side = "left"
    pictures = [[Image.open(path).convert("RGB")] for path in images]
    batch = processor(text=[prompts[0], f"<image> {prompts[1]}"], images=pictures, return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = model.generate(**batch, do_sample=False, max_new_tokens=8)
    assert result["sequences"] == expected.tolist()
    assert (batch["input_ids"] == IMAGE_TOKEN).sum() == 32 and batch["attention_mask"][1, 0] == 0  # row 1 padded
    assert len(result["texts"]) == 2 and result["stats"]["encode_s"] > 0


@pytest.mark.parametrize("extra,message", [
    (["--input-ids", "5,6", "--image", "{a}"], "--image needs the prompt as text"),
    (["--prompt", "w5", "--image", "/nonexistent.png"], "--image /nonexistent.png is not a file"),
    (["--prompt", "w5", "--prompt", "w6", "--prompt", "w7", "--image", "{a}", "--image", "{a}"],
     "2 --image for 3 --prompt"),
    (["--prompt", "w5", "--image", "{model}/config.json"], "does not read as an image"),
])
def test_bad_images_exit_2_naming_what_was_wrong(llava, capsys, extra, message):
    _, directory, out, images = llava
    args = [a.format(a=images[0], model=directory) for a in extra]
    assert cli.main(["generate", str(out), *args, "--max-new-tokens", "2"]) == 2
    assert message in capsys.readouterr().err


def test_a_processor_config_that_resizes_past_the_bound_is_refused_before_it_runs(llava, tmp_path, capsys):
    """Issue 43: a processor config resizing images to 12,000 px grew the process by 5.5 GiB over 112 s before the
    prompt was refused. Here a shortest edge of 4,200 px (22 M pixels for the 40x50 image, past the 16.8 M bound:
    cheap enough if the check is gone)."""
    import shutil

    from crafting import rehash

    _, _, out, images = llava
    artifact = tmp_path / "vlm"
    shutil.copytree(out, artifact)
    crafted = []
    for file in artifact.glob("*.json"):
        text = file.read_text()
        if '"crop_size"' in text:
            config = json.loads(text)
            section = config.get("image_processor", config)
            section["size"], section["crop_size"] = {"shortest_edge": 4200}, {"height": 4200, "width": 4200}
            file.write_text(json.dumps(config))
            crafted.append(file.name)
    assert crafted
    rehash(artifact)
    assert cli.main(["generate", str(artifact), "--prompt", "w5", "--image", str(images[0]),
                     "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "resizes images to 22,050,000 pixels (size.shortest_edge)" in err and "over the bound of 16,777,216" in err, err


def test_one_prompt_and_one_image_equals_eager(llava, capsys):
    """One --prompt with one --image (a user's run failed with IndexError where two prompts worked), in-process."""
    from PIL import Image

    model, directory, out, images = llava
    assert cli.main(["generate", str(out), "--prompt", "w5 w6", "--image", str(images[0]), "--max-new-tokens", "4",
                     "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    processor = _processor()
    batch = processor(text=["<image> w5 w6"], images=[[Image.open(images[0]).convert("RGB")]], return_tensors="pt")
    with torch.no_grad():
        expected = model.generate(**batch, do_sample=False, max_new_tokens=4)
    assert result["sequences"] == expected.tolist()
