"""A model named by its Hugging Face Hub id (``ORG/NAME``), found as ``from_pretrained`` finds it:
in the local Hugging Face cache (``HF_HOME``, ``HF_HUB_CACHE``), offline where ``HF_HUB_OFFLINE=1``,
downloaded when online. Whether it can be had is settled before any work, by fetching its
``config.json`` (from the cache, or a few hundred bytes from the Hub); an id that is neither
cached nor reachable is one sentence naming the id, the cache folder and ``HF_HUB_OFFLINE``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from leadline.errors import InputError

PATH_PREFIXES = ("./", "../", ".\\", "..\\", "/", "\\", "~")
# the Hub's own rule (huggingface_hub's validate_repo_id): NAME or ORG/NAME, letters, digits, - _ .
_REPO_ID = re.compile(r"(?:[\w\-.]+/)?[\w\-.]{1,96}")


def looks_like_path(given: str) -> bool:
    """Whether ``given`` can only name a file or folder: it starts like a path (``./``, ``../``,
    ``/``, ``~``), ends in ``.gguf``, or is nothing a Hub id can be.

    Examples:
        >>> [looks_like_path(s) for s in ("./tiny", "/models/x", "~/m", "smol.gguf", "a/b/c", "C:\\\\m")]
        [True, True, True, True, True, True]
        >>> [looks_like_path(s) for s in ("HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2", "my-model")]
        [False, False, False]
    """
    return given.startswith(PATH_PREFIXES) or given.lower().endswith(".gguf") or not is_hub_id(given)


def is_hub_id(given: str) -> bool:
    """Whether ``given`` is written as a Hub model id: ``NAME`` or ``ORG/NAME`` of letters, digits,
    ``-``, ``_`` and ``.``, at most 96 characters a part, no ``--`` or ``..``, not ending in ``.git``.

    Examples:
        >>> is_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct"), is_hub_id("org/name/extra"), is_hub_id("a--b")
        (True, False, False)
    """
    return (bool(_REPO_ID.fullmatch(given)) and "--" not in given and ".." not in given
            and not given.endswith(".git") and not any(part[:1] in "-." or part[-1:] in "-."
                                                       for part in given.split("/")))


def hub_cache() -> str:
    """The folder the Hugging Face cache is in (``HF_HUB_CACHE``, else ``HF_HOME/hub``), as
    huggingface_hub read it when it was imported."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) forbids the Hub, as huggingface_hub
    read it."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


@dataclass(frozen=True)
class HubModel:
    """A Hub model that can be loaded: its id, the revision asked for (None: ``main``), the commit
    that revision resolved to, and the snapshot folder its files are cached in."""

    repo_id: str
    revision: str | None
    commit: str | None
    snapshot: Path


def find_on_hub(repo_id: str, revision: str | None = None) -> HubModel:
    """The Hub model ``repo_id`` at ``revision``, its ``config.json`` fetched as
    ``from_pretrained`` fetches it (the cache first; the Hub where online); one sentence where it
    cannot be had: not cached and offline or unreachable, not on the Hub, gated, no such revision,
    or no ``config.json``.

    Examples:
        >>> import os, tempfile
        >>> from huggingface_hub import constants
        >>> empty = tempfile.TemporaryDirectory()
        >>> before = constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE
        >>> constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = empty.name, True
        >>> try:
        ...     find_on_hub("org/name")
        ... except InputError as e:
        ...     print(str(e).replace(empty.name, "CACHE"))
        ... finally:
        ...     constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = before
        ...     empty.cleanup()
        model org/name is neither a folder here nor in the Hugging Face cache (CACHE), and HF_HUB_OFFLINE=1 keeps ...
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f" at revision {revision}" if revision else ""
    try:
        config = Path(hf_hub_download(repo_id, "config.json", revision=revision))
    except GatedRepoError:
        raise InputError(f"model {repo_id} is gated on the Hugging Face Hub; accept its terms at "
                         f"https://huggingface.co/{repo_id} and log in (`hf auth login`, or set HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise InputError(f"model {repo_id} is neither a folder here nor a model on the Hugging Face Hub (or it is "
                         "private: log in with `hf auth login`, or set HF_TOKEN); pass a Hugging Face folder, a .gguf "
                         "file or a Hub id") from None
    except RevisionNotFoundError:
        raise InputError(f"revision {revision} is not a branch, tag or commit of the Hub model {repo_id}; pass "
                         "one it has, or leave the revision out (main)") from None
    except LocalEntryNotFoundError as e:
        raise InputError(_unreachable(repo_id, at, e)) from None
    except EntryNotFoundError:
        raise InputError(f"the Hub model {repo_id}{at} has no config.json, so transformers cannot load it as a "
                         "causal LM; pass a repository that has one, or download its .gguf file and pass the "
                         "file") from None
    except (OSError, ValueError) as e:  # a refused request, a malformed revision
        raise InputError(f"model {repo_id}{at} cannot be had from the Hugging Face Hub "
                         f"({str(e).splitlines()[0][:160]}); pass a Hugging Face folder, a .gguf file or a Hub id "
                         "in the cache") from None
    snapshot = config.parent
    commit = snapshot.name if snapshot.parent.name == "snapshots" else None
    return HubModel(repo_id, revision, commit, snapshot)


def _unreachable(repo_id: str, at: str, error: BaseException) -> str:
    """Why a Hub model that is not in the cache could not be fetched, in one sentence."""
    where = f"model {repo_id}{at} is neither a folder here nor in the Hugging Face cache ({hub_cache()})"
    fix = "pass a Hugging Face folder, a .gguf file or a Hub id in the cache"
    if hub_offline():
        return (f"{where}, and HF_HUB_OFFLINE=1 keeps it from being downloaded; unset HF_HUB_OFFLINE to download "
                f"it, or {fix}")
    cause = error.__cause__ or error.__context__
    why = f" ({str(cause).splitlines()[0][:120]})" if cause is not None and str(cause) else ""
    return (f"{where}, and the Hugging Face Hub could not be reached{why}; connect to download it (HF_HUB_OFFLINE "
            f"unset), or {fix}")


def hub_id_given(given: str | os.PathLike[str]) -> str | None:
    """``given`` where it is to be looked up on the Hub: written as a Hub id, not a path, and no
    file or folder of that name here (a folder wins, as in ``from_pretrained``); else None.

    Examples:
        >>> hub_id_given("HuggingFaceTB/SmolLM2-135M-Instruct"), hub_id_given("./tiny"), hub_id_given("x.gguf")
        ('HuggingFaceTB/SmolLM2-135M-Instruct', None, None)
    """
    if not isinstance(given, str) or os.path.exists(given) or looks_like_path(given):
        return None
    return given
