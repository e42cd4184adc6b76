"""Turn a GGUF file into a Hugging Face model directory, for machines that cannot reach a hub.

Two routes write the same bytes. The default for qwen2 (calcx.model.direct) writes the weights
straight from the GGUF's tensors in worker processes, while transformers reads the tokenizer and
config from the file's fields beside them. `--via transformers` (any architecture transformers
reads; the default for the others) dequantizes every tensor into a float32 model, which cannot be
saved as read, so the weights are copied into a fresh model of the same class built from the read
config without its quantization entry. Either way the mapping is strict: a missing or unexpected
tensor is an error, never a silently random weight. The result is saved as safetensors, with the
tokenizer and the GGUF's own chat template (vLLM's tool-call parsing depends on it). Output is
written next to --out and renamed into place, so a failed conversion leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from calcx.model.direct import HF_NAMES, MappingError, hf_names, write_weights

GGUF_MAGIC = b"GGUF"
CHAT_TEMPLATE_FIELD = "tokenizer.chat_template"
DTYPES = ("bfloat16", "float16", "float32")
VIAS = ("auto", "gguf", "transformers")


class ConvertError(Exception):
    """A conversion that cannot go ahead; the message says what was wrong and what to do."""


@dataclass
class Converted:
    out: Path
    architecture: str
    parameters: int
    bytes_written: int


def _lacks(name: str, exc: ImportError) -> ConvertError:
    return ConvertError(
        f"this build lacks {name} ({exc}); use the trainer artifact (the calcx-gpu PEX on a GPU "
        "machine) or a Python environment with torch, transformers, gguf and accelerate"
    )


def _require() -> tuple[Any, Any, Any]:
    """torch, transformers and gguf, or ConvertError naming the one this build lacks.

    transformers also needs accelerate to read a GGUF; it is checked here so that its absence is
    named as such rather than surfacing as a read error.
    """
    try:
        import torch
    except ImportError as exc:
        raise _lacks("torch", exc) from None
    try:
        import transformers
    except ImportError as exc:
        raise _lacks("transformers", exc) from None
    try:
        import gguf
    except ImportError as exc:
        raise _lacks("gguf", exc) from None
    try:
        import accelerate  # noqa: F401  (transformers refuses to read a GGUF without it)
    except ImportError as exc:
        raise _lacks("accelerate", exc) from None
    return torch, transformers, gguf


def name_gguf_distribution() -> None:
    """Tell transformers which distribution provides the `gguf` module.

    transformers reads gguf's version through a module -> distribution map built once from the
    installed distributions' RECORD files (`importlib.metadata.packages_distributions()`). In a
    PEX venv (calcx-gpu.pex) those files list no modules, gguf's version reads as 'N/A', and
    transformers refuses every GGUF file with "Invalid version: 'N/A'" (seen on the GPU machine).
    """
    from transformers.utils import import_utils

    mapping = getattr(import_utils, "PACKAGE_DISTRIBUTION_MAPPING", None)
    if isinstance(mapping, dict) and not mapping.get("gguf"):
        mapping["gguf"] = ["gguf"]


def check_gguf(path: Path) -> None:
    if not path.exists():
        raise ConvertError(f"{path}: no such file; pass --gguf the path of a .gguf file")
    if not path.is_file():
        raise ConvertError(f"{path}: not a file; pass --gguf the path of a .gguf file")
    with path.open("rb") as handle:
        magic = handle.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise ConvertError(
            f"{path}: not a GGUF file (it starts with {magic!r}, a GGUF file with {GGUF_MAGIC!r}); "
            "is it a partial download, or the pieces not yet joined?"
        )


def check_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConvertError(f"{out}: exists and is not a directory; choose another --out")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConvertError(f"{out}: exists and is not empty; choose another --out, or pass --force to replace it")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def normalise_sha256(text: str) -> str:
    value = text.strip().lower()
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ConvertError(f"--sha256 {text!r} is not a sha256 (64 hex digits)")
    return value


@dataclass
class Metadata:
    """What the conversion takes from the GGUF's own fields rather than from transformers."""

    chat_template: str | None
    special_ids: dict[str, int]  # "bos_token"/"eos_token"/"pad_token" -> token id
    architecture: str
    layers: int
    reader: Any  # the gguf.GGUFReader, for the direct path's tensors


SPECIAL_ID_FIELDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def read_metadata(gguf_module: Any, path: Path) -> Metadata:
    reader = gguf_module.GGUFReader(str(path))
    field = reader.fields.get(CHAT_TEMPLATE_FIELD)
    template = field.contents() if field is not None else None
    ids = {}
    for role, name in SPECIAL_ID_FIELDS.items():
        if name in reader.fields:
            ids[role] = int(reader.fields[name].contents())
    architecture = str(reader.fields["general.architecture"].contents())
    block_count = reader.fields.get(f"{architecture}.block_count")
    layers = int(block_count.contents()) if block_count is not None else 0
    template = template if isinstance(template, str) and template.strip() else None
    return Metadata(template, ids, architecture, layers, reader)


def set_special_tokens(tokenizer: Any, special_ids: dict[str, int]) -> None:
    """Name the GGUF's bos/eos/pad tokens on the tokenizer.

    transformers' GGUF tokenizer converters pick their own (Qwen2's eos is <|endoftext|> where
    an Instruct GGUF says <|im_end|>; the llama converter sets eos to the bos token), while
    generation stops on the GGUF's ids, which config.json keeps.
    """
    for role, token_id in special_ids.items():
        if 0 <= token_id < len(tokenizer):
            setattr(tokenizer, role, tokenizer.convert_ids_to_tokens(token_id))


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def convert(
    gguf: str | Path,
    out: str | Path,
    *,
    dtype: str = "bfloat16",
    sha256: str | None = None,
    force: bool = False,
    chat_template_file: str | Path | None = None,
    via: str = "auto",
    log: Callable[[str], None] = print,
) -> Converted:
    """Convert ``gguf`` into a model directory at ``out``; ConvertError for anything a user can fix.

    ``via``: "gguf" writes the weights straight from the file (calcx.model.direct), "transformers"
    through a transformers model; "auto" takes the first where the architecture allows it.
    """
    gguf, out = Path(gguf), Path(out)
    if dtype not in DTYPES:
        raise ConvertError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if via not in VIAS:
        raise ConvertError(f"--via {via!r} is not one of {', '.join(VIAS)}")
    expected = normalise_sha256(sha256) if sha256 is not None else None
    check_gguf(gguf)
    check_out(out, force)
    template_override = None
    if chat_template_file is not None:
        try:
            template_override = Path(chat_template_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConvertError(f"--chat-template {chat_template_file}: cannot read: {exc.strerror or exc}") from None
    torch, transformers, gguf_module = _require()
    name_gguf_distribution()

    started = time.monotonic()
    actual = sha256_of(gguf)
    if expected is not None and actual != expected:
        raise ConvertError(
            f"{gguf}: sha256 is {actual}, expected {expected}; the file is damaged or not the one "
            "meant (re-copy it, or check the pieces were joined in order)"
        )
    checked = "matches --sha256" if expected is not None else "not checked: no --sha256"
    log(f"verify sha256: {actual} ({checked}) ({time.monotonic() - started:.1f} s)")

    started = time.monotonic()
    try:
        metadata = read_metadata(gguf_module, gguf)
    except (ValueError, KeyError, IndexError, OSError) as exc:  # GGUFReader on a damaged or truncated file
        raise ConvertError(
            f"{gguf}: cannot be read as GGUF ({type(exc).__name__}: {exc}); the file is "
            "damaged or truncated (compare its sha256 with the source's)"
        ) from None
    template = template_override if template_override is not None else metadata.chat_template
    if template is None:
        raise ConvertError(
            f"{gguf}: has no {CHAT_TEMPLATE_FIELD}; pass --chat-template FILE (a Jinja chat "
            "template) to give the model one"
        )
    architecture = metadata.architecture
    if via == "auto":
        via = "gguf" if architecture in HF_NAMES else "transformers"
    if via == "gguf":
        if architecture not in HF_NAMES:
            raise ConvertError(
                f"{gguf}: --via gguf knows the tensors of {', '.join(HF_NAMES)}, not {architecture}; "
                "pass --via transformers"
            )
        return _convert_direct(gguf, out, dtype, template, metadata, transformers, started, log)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    except (ValueError, KeyError, OSError, RuntimeError) as exc:
        raise ConvertError(f"{gguf}: transformers {transformers.__version__} cannot read it: {exc}") from None
    config = loaded.config
    log(
        f"read: {config.model_type} ({type(loaded).__name__}), {config.num_hidden_layers} layers, hidden "
        f"{config.hidden_size}, vocab {config.vocab_size} ({time.monotonic() - started:.1f} s)"
    )

    started = time.monotonic()
    fresh = _rebuild(loaded, torch, dtype, gguf)
    del loaded
    parameters = sum(p.numel() for p in fresh.parameters())
    log(
        f"rebuild: {type(fresh).__name__}, {parameters:,} parameters as {dtype} "
        f"({time.monotonic() - started:.1f} s)"
    )

    started = time.monotonic()
    _save(fresh, tokenizer, template, metadata.special_ids, out)
    written = _size(out)
    log(f"save: {out} ({written / 1e6:.1f} MB) ({time.monotonic() - started:.1f} s)")
    return Converted(out, config.model_type, parameters, written)


def _convert_direct(
    gguf: Path,
    out: Path,
    dtype: str,
    template: str,
    metadata: Metadata,
    transformers: Any,
    started: float,
    log: Callable[[str], None],
) -> Converted:
    """The weights written from the GGUF's own tensors; config and tokenizer read by transformers
    (from the file's fields only) and saved as the transformers route saves them.

    transformers parses the file's fields once for the tokenizer and once for the config (~20 s of
    one core for a 151k vocabulary), so both run in processes of their own beside the weights.
    """
    reader = metadata.reader
    try:
        names = hf_names(metadata.architecture, [t.name for t in reader.tensors], metadata.layers)
    except MappingError as exc:
        raise ConvertError(
            f"{gguf}: the tensors do not fit {metadata.architecture}: {exc}; this file is not supported as is"
        ) from None
    log(
        f"read: {metadata.architecture}, {len(names)} tensors, {metadata.layers} layers ({time.monotonic() - started:.1f} s)"
    )

    started = time.monotonic()
    reads: tuple[SideRead, ...] = ()
    try:
        with _written_whole(out) as partial:
            reads = start_side_reads((_read_tokenizer, _read_config), gguf)
            parameters, _ = write_weights(reader, gguf, names, dtype, partial / SAFETENSORS_FILE)
            log(f"weights: {parameters:,} parameters as {dtype} ({time.monotonic() - started:.1f} s)")
            started = time.monotonic()
            try:
                tokenizer, config = reads[0].get(), reads[1].get()
            except (ValueError, KeyError, OSError, RuntimeError, EOFError) as exc:
                raise ConvertError(f"{gguf}: transformers {transformers.__version__} cannot read it: {exc}") from None
            log(
                f"tokenizer and config: read beside the weights; waited for after them ({time.monotonic() - started:.1f} s)"
            )
            started = time.monotonic()
            _save_config(config, transformers, dtype, partial)
            _save_tokenizer(tokenizer, template, metadata.special_ids, partial)
    finally:
        for read in reads:
            read.stop()
    written = _size(out)
    log(f"save: {out} ({written / 1e6:.1f} MB) ({time.monotonic() - started:.1f} s)")
    return Converted(out, metadata.architecture, parameters, written)


class SideRead:
    """One transformers read of the GGUF in a forked process of its own; its result, or its exception,
    comes back through a pipe. A plain process: a pool's threads in this one would make the weight
    workers' fork unsafe."""

    def __init__(self, read: Callable[[Path], Any], gguf: Path):
        context = get_context("fork")
        self._receive, send = context.Pipe(duplex=False)
        try:
            self._process = context.Process(target=_send_read, args=(send, read, gguf), daemon=True)
            self._process.start()
        except BaseException:
            self._receive.close()
            raise
        finally:
            send.close()

    def get(self) -> Any:
        """The read's result; its exception re-raised; EOFError where the process died without one."""
        ok, value = self._receive.recv()
        self._process.join()
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
        self._process.join()
        self._receive.close()


def start_side_reads(reads: Iterable[Callable[[Path], Any]], gguf: Path) -> tuple[SideRead, ...]:
    """A started SideRead of ``gguf`` for each of ``reads``, or none: where one fails to start (no
    process or descriptor left), those started before it are stopped, not left reading as daemons
    until this process exits."""
    started: list[SideRead] = []
    try:
        for read in reads:
            started.append(SideRead(read, gguf))
    except BaseException:
        for side in started:
            side.stop()
        raise
    return tuple(started)


def _send_read(send: Any, read: Callable[[Path], Any], gguf: Path) -> None:
    try:
        result = (True, read(gguf))
    except Exception as exc:  # sent back whole, raised there
        result = (False, exc)
    send.send(result)


def _read_tokenizer(gguf: Path) -> Any:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def _read_config(gguf: Path) -> Any:
    import transformers

    return transformers.AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


SAFETENSORS_FILE = "model.safetensors"  # save_pretrained's name for an unsharded model


def _save_config(config: Any, transformers: Any, dtype: str, out: Path) -> None:
    """config.json and generation_config.json as save_pretrained writes them for the model class."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    config.dtype = dtype
    config.save_pretrained(out)
    generation = transformers.GenerationConfig.from_model_config(config)
    generation.save_pretrained(out)


def _rebuild(loaded: Any, torch: Any, dtype: str, gguf: Path) -> Any:
    """The model transformers read from the GGUF, rebuilt as a plain model of its class in `dtype`
    (no quantization config left), its weights checked to fit the class one for one."""
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    # every weight is loaded right after: building without transformers' random initialisation
    # (weights tied as its init would tie them) spares ~20-30 s of CPU on a 1.5B model
    from transformers.initialization import no_init_weights  # a submodule transformers loads lazily

    with no_init_weights():
        fresh = type(loaded)(config)
    fresh.tie_weights()
    weights, wanted = loaded.state_dict(), set(fresh.state_dict())
    missing, unexpected = sorted(wanted - set(weights)), sorted(set(weights) - wanted)
    if missing or unexpected:
        raise ConvertError(
            f"{gguf}: the weights read do not fit {type(fresh).__name__}: missing {missing}, "
            f"unexpected {unexpected}; this architecture is not supported as is"
        )
    fresh.load_state_dict(weights, strict=True)
    del weights
    target = getattr(torch, dtype)
    fresh.to(target)
    fresh.config.dtype = target
    return fresh


@contextlib.contextmanager
def _written_whole(out: Path) -> Iterator[Path]:
    """A directory beside `out` to write the model into, moved into place whole when the block
    ends and removed when it fails (never half a model)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    partial.chmod(0o755)  # mkdtemp's 0700 would hide the model from a server running as another user
    try:
        yield partial
        if out.exists():
            shutil.rmtree(out)
        os.replace(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _save_tokenizer(tokenizer: Any, template: str, special_ids: dict[str, int], directory: Path) -> None:
    """The tokenizer with the GGUF's own chat template and special tokens (vLLM's tool-call parsing
    depends on the template)."""
    tokenizer.chat_template = template
    set_special_tokens(tokenizer, special_ids)
    tokenizer.save_pretrained(directory)


def _save(model: Any, tokenizer: Any, template: str, special_ids: dict[str, int], out: Path) -> None:
    """The transformers route's model directory, written whole."""
    with _written_whole(out) as partial:
        model.save_pretrained(partial, safe_serialization=True)
        _save_tokenizer(tokenizer, template, special_ids, partial)
