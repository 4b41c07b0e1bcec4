"""``hf-tdiag convert-official --preset simdino|simdinov2``: the folder it writes loads with AutoModel and equals the
forward written from the equations (tests/test_simdino_convert.py), keeps its input, runs in srr and schatten; its
errors are one line and leave the folder as it was."""

import torch
from test_simdino_convert import HEADS, PATCH, _backbone, _hidden, _images, _reference, _v1_checkpoint, _v2_checkpoint


def _tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_cli_converts_into_a_folder_automodel_loads_and_srr_and_schatten_read(tmp_path, capsys):
    import argparse

    from safetensors.torch import load_file
    from transformers import AutoModel

    from hf_tdiag.cli import main

    teacher = _backbone("simdino", seed=4)
    ckpt = _v1_checkpoint(_backbone("simdino", seed=5), teacher)
    ckpt["args"] = argparse.Namespace(arch="vit_small", patch_size=PATCH)  # main_dino.py saves its args too
    folder = tmp_path / "run"
    folder.mkdir()
    torch.save(ckpt, folder / "checkpoint.pth")
    before = (folder / "checkpoint.pth").read_bytes()
    argv = ["convert-official", str(folder / "checkpoint.pth"), "--preset", "simdino", "--num-heads", str(HEADS)]
    assert main([*argv, "--output-dir", str(folder)]) == 0, capsys.readouterr().err
    assert "ViTModel, 2 layers, d=32, 4 heads" in capsys.readouterr().out
    assert (folder / "checkpoint.pth").read_bytes() == before  # the input inside the output folder is kept
    model = AutoModel.from_pretrained(folder, add_pooling_layer=False).eval()
    x = _images()
    torch.testing.assert_close(_hidden(model, x), _reference(teacher, x), rtol=0, atol=1e-5)
    heads = load_file(str(folder / "simdino_head.safetensors"))
    assert torch.equal(heads["head.mlp.0.weight"], ckpt["teacher"]["head.mlp.0.weight"])
    # converting again over its own output: refused without the flag, the input untouched either way
    assert main([*argv, "--output-dir", str(folder)]) == 1
    assert main([*argv, "--output-dir", str(folder), "--overwrite-output-dir"]) == 0
    assert (folder / "checkpoint.pth").read_bytes() == before
    # the diagnostics read the converted folder
    assert (
        main(["srr", str(folder), "--dataset", "digits", "--max-samples", "8", "--output-dir", str(tmp_path / "srr")])
        == 0
    )
    assert main(["schatten", str(folder), "--no-figures", "--output-dir", str(tmp_path / "sch")]) == 0
    assert (tmp_path / "srr" / "srr.json").is_file() and (tmp_path / "sch" / "schatten.json").is_file()


def test_cli_errors_are_one_line_and_leave_the_folder_as_it_was(tmp_path, capsys):
    from hf_tdiag.cli import main

    teacher = _backbone("simdinov2", registers=2, chunks=2, layer_scale=True)
    del teacher["blocks.1.1.ls2.gamma"]
    torch.save(_v2_checkpoint(teacher), tmp_path / "ck.pth")
    out = tmp_path / "out"
    cases = [
        (["--preset", "simdinov2", "--num-heads", "4"], "missing keys ['blocks.1.ls2.gamma']"),
        (["--preset", "simdinov2", "--student"], "no 'student' network"),
        (["--preset", "simdinov2", "--labels", str(tmp_path / "ck.pth")], "--labels: a simdinov2 checkpoint"),
        (["--preset", "crate-digits", "--num-heads", "4"], "--num-heads: only for --preset simdino or simdinov2"),
    ]
    before = _tree(tmp_path)
    for flags, message in cases:
        code = main(["convert-official", str(tmp_path / "ck.pth"), *flags, "--output-dir", str(out)])
        err = capsys.readouterr().err
        assert code == 1 and len(err.strip().splitlines()) == 1 and message in err, err
        assert {k: v for k, v in _tree(tmp_path).items() if not k.startswith("out/.hf-tdiag")} == before
    # a checkpoint named like the heads file the conversion writes is refused, not replaced
    named = tmp_path / "run" / "simdino_head.safetensors"
    named.parent.mkdir()
    torch.save(_v2_checkpoint(_backbone("simdinov2")), named)
    before = named.read_bytes()
    argv = [
        "convert-official",
        str(named),
        "--preset",
        "simdinov2",
        "--num-heads",
        "4",
        "--output-dir",
        str(named.parent),
    ]
    assert main([*argv, "--overwrite-output-dir"]) == 1
    assert "would replace the input" in capsys.readouterr().err and named.read_bytes() == before
