"""Artifacts on the Hugging Face Hub: load one by repo id (download ``export.json`` first, then only the files it
names, pinned to the commit that manifest came from) and push one beside a model's own files.

``huggingface_hub`` is imported only here, and only when a Hub artifact is loaded or pushed (``hfexport --help``
stays fast).

- Loading: ``export.json`` is downloaded and checked (schema, every file it names a plain relative path) before
  anything else is fetched; then exactly the files it names, from the same commit; then the snapshot directory is
  opened as a local artifact (sizes and SHA-256 of every file, no code run from it). With ``HF_HUB_OFFLINE=1`` it
  works from a populated Hugging Face cache.
- Pushing: the artifact is saved into a temporary directory and committed with one ``CommitOperationAdd`` per
  file: nothing in the repository is deleted, and a file of the same name that differs is refused unless an
  earlier artifact at that path wrote it (named in its ``export.json``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = ["default_path_in_repo", "download_artifact", "is_hub_reference", "push_artifact"]

# "org/name": what a Hub model repository id looks like (one slash, no "..", no "--" at either end).
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def is_hub_reference(path: Any) -> bool:
    """Whether ``path`` names a Hub repository: a string (a ``Path`` is always local) that is not an existing local
    path and looks like ``org/name``."""
    return (isinstance(path, str) and bool(_REPO_ID.match(path)) and ".." not in path and "--" not in path
            and not path.endswith(".") and not os.path.exists(path))


def default_path_in_repo(backend: str) -> str:
    """Where :meth:`ExportedModel.push_to_hub` puts an artifact by default: ``hfexport/<backend>``, a folder of its
    own, so that it never meets the model's own ``config.json`` or weights."""
    return f"hfexport/{backend}"


def _describe(repo_id: str, revision: str | None, subfolder: str | None) -> str:
    return repo_id + (f"@{revision}" if revision else "") + (f" (subfolder {subfolder!r})" if subfolder else "")


def _hub_error(exc: BaseException, repo_id: str, revision: str | None, subfolder: str | None,
               names: list[str]) -> Exception:
    """One clear error for a failed download of ``names`` (the first is ``export.json`` when it is the one)."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = _describe(repo_id, revision, subfolder)
    manifest = names == ["export.json"]
    parent = repo_id.split("/")[0]
    # out/gen2 reads as a repository id org/name; when out/ is a local directory, the user most likely meant a path
    local = (f"; {parent}/ is a local directory, and {repo_id} does not exist in it (a typo in the path?)"
             if os.path.isdir(parent) else "")
    if isinstance(exc, LocalEntryNotFoundError):
        offline = " (HF_HUB_OFFLINE is set)" if constants.HF_HUB_OFFLINE else " and the Hub could not be reached"
        if manifest:
            return FileNotFoundError(
                f"{repo_id} is not a local directory, and the Hugging Face cache ({constants.HF_HUB_CACHE}) holds no "
                f"export.json of {where}{offline}: download it once online, or give the artifact's directory{local}")
        return FileNotFoundError(
            f"the Hugging Face cache holds the export.json of {where} but not {names}, which its manifest "
            f"names{offline}: download the artifact again online (hfexport.load({repo_id!r}) fetches only its files)")
    if isinstance(exc, RepositoryNotFoundError):
        return FileNotFoundError(f"{repo_id} is neither a local directory nor a Hub repository you can read "
                                 f"(private or gated: log in with `hf auth login` or pass token=){local}")
    if isinstance(exc, RevisionNotFoundError):
        return FileNotFoundError(f"Hub repository {repo_id} has no revision {revision!r}")
    if isinstance(exc, EntryNotFoundError):
        if manifest:
            return FileNotFoundError(
                f"{where} is not an hfexport artifact: it has no export.json"
                + ("" if subfolder else " at its root (push_to_hub puts artifacts under 'hfexport/<backend>' by "
                                         "default: pass subfolder='hfexport/dynamo', or the backend you pushed)"))
        return FileNotFoundError(f"{where} lacks files its manifest names: {names}")
    return OSError(f"could not download {names} of {where}: {exc}")


def _snapshot_commit(directory: Path) -> str | None:
    """The commit hash of a Hugging Face cache snapshot directory (``.../snapshots/<commit>/[subfolder]``)."""
    for ancestor in [directory, *directory.parents]:
        if ancestor.parent.name == "snapshots":
            return ancestor.name
    return None


def download_artifact(repo_id: str, *, revision: str | None = None, subfolder: str | None = None,
                      cache_dir: str | os.PathLike[str] | None = None, token: str | bool | None = None) -> Path:
    """Download the artifact of Hub repository ``repo_id`` into the Hugging Face cache; its snapshot directory.

    ``export.json`` first: validated (schema, every file it names a plain relative path inside the artifact)
    before anything else is fetched; then only the files it names, pinned to the commit that ``export.json`` came
    from. File contents are checked by the caller (:func:`hfexport.load` checks every SHA-256).

    Raises:
        FileNotFoundError: no such repository or revision, no ``export.json``, a file it names missing; offline,
            not in the cache (says which).
        hfexport.ManifestError: ``export.json`` is not a valid manifest.
        ValueError: it names a file outside the artifact.
        OSError: another download failure (network, authentication).
    """
    from huggingface_hub import hf_hub_download

    from ._artifact_files import read_manifest
    from ._trust import MANIFEST_NAME, manifest_file_refs

    sub = str(PurePosixPath(subfolder.strip("/"))) if subfolder and subfolder.strip("/") else None
    if sub is not None and (".." in PurePosixPath(sub).parts or "\\" in sub):
        raise ValueError(f"subfolder={subfolder!r} must be a relative path inside the repository, without '..'")
    common: dict[str, Any] = {"subfolder": sub, "cache_dir": cache_dir, "token": token, "library_name": "hfexport"}
    try:
        manifest_file = Path(hf_hub_download(repo_id, MANIFEST_NAME, revision=revision, **common))
    except Exception as exc:  # noqa: BLE001 - every Hub failure becomes one clear error
        raise _hub_error(exc, repo_id, revision, sub, [MANIFEST_NAME]) from exc
    directory = manifest_file.parent
    manifest = read_manifest(directory, check_present=False)  # schema and paths, before fetching what it names
    pinned = _snapshot_commit(directory) or revision
    names = sorted({name for _, name in manifest_file_refs(manifest)} - {MANIFEST_NAME})
    missing = []
    for name in names:
        try:
            hf_hub_download(repo_id, name, revision=pinned, **common)
        except Exception as exc:  # noqa: BLE001
            error = _hub_error(exc, repo_id, revision, sub, [name])
            if not isinstance(error, FileNotFoundError):
                raise error from exc
            missing.append((name, exc))
    if missing:
        raise _hub_error(missing[0][1], repo_id, revision, sub, [n for n, _ in missing]) from missing[0][1]
    return directory


# ── push ──────────────────────────────────────────────────────────────────────────────────────────────────
def _git_blob_id(file: Path) -> str:
    data = file.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _same_content(info: Any, file: Path) -> bool:
    sha256 = getattr(getattr(info, "lfs", None), "sha256", None)
    if sha256:
        return sha256 == hashlib.sha256(file.read_bytes()).hexdigest()
    return getattr(info, "blob_id", None) == _git_blob_id(file)


def _remote_manifest_files(api: Any, repo_id: str, path: str, revision: str | None,
                           token: str | bool | None) -> set[str] | None:
    """The ``files`` of the hfexport manifest at ``path`` in the repository, itself included; ``None`` when the
    file there is not one."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(repo_id, path, revision=revision, endpoint=api.endpoint)
    headers = build_hf_headers(token=token if token is not None else api.token, library_name="hfexport")
    response = get_session().get(url, headers=headers, follow_redirects=True)
    hf_raise_for_status(response)
    try:
        manifest = json.loads(response.content)
    except ValueError:
        return None
    files = manifest.get("files") if isinstance(manifest, dict) and "backend" in manifest else None
    if not isinstance(files, list):
        return None
    return {f for f in files if isinstance(f, str)} | {PurePosixPath(path).name}


def push_artifact(model: Any, repo_id: str, *, revision: str | None = None,
                  path_in_repo: str | None = None, commit_message: str | None = None,
                  token: str | bool | None = None, create_repo: bool = True, private: bool | None = None,
                  endpoint: str | None = None, api: Any = None) -> Any:
    """:meth:`ExportedModel.push_to_hub` (see there)."""
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.hf_api import RepoFile

    from ._trust import MANIFEST_NAME

    if api is None:
        api = HfApi(endpoint=endpoint, token=token, library_name="hfexport")
    prefix = default_path_in_repo(model.backend) if path_in_repo is None else path_in_repo.strip("/")
    if prefix and (".." in PurePosixPath(prefix).parts or "\\" in prefix or prefix.startswith(".")):
        raise ValueError(f"path_in_repo={path_in_repo!r} must be a relative folder of the repository, without '..'")

    def remote(name: str) -> str:
        return f"{prefix}/{name}" if prefix else name

    if create_repo:
        api.create_repo(repo_id, token=token, private=private, exist_ok=True)
        if revision is not None:
            api.create_branch(repo_id, branch=revision, token=token, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hfexport-push-") as tmp:
        directory = model.save_pretrained(Path(tmp) / "artifact")
        files = list(model.manifest["files"])
        infos = api.get_paths_info(repo_id, [remote(f) for f in files], revision=revision, token=token)
        existing = {info.path: info for info in infos}
        folders = [f for f in files if remote(f) in existing and not isinstance(existing[remote(f)], RepoFile)]
        differing = [f for f in files if remote(f) in existing and f not in folders
                     and not _same_content(existing[remote(f)], directory / f)]
        if differing and remote(MANIFEST_NAME) in existing:  # an earlier artifact there: its own files may go
            owned = _remote_manifest_files(api, repo_id, remote(MANIFEST_NAME), revision, token) or set()
            differing = [f for f in differing if f not in owned]
        if folders or differing:
            where = f"{repo_id}/{prefix}" if prefix else repo_id
            raise FileExistsError(
                f"pushing this artifact to {where} would overwrite files that are not part of an hfexport artifact "
                f"there: {[remote(f) for f in folders + differing]}; push_to_hub never replaces a model's own files: "
                f"pass another path_in_repo (the default, {default_path_in_repo(model.backend)!r}, is a folder of "
                "its own)")
        operations = [CommitOperationAdd(path_in_repo=remote(f), path_or_fileobj=str(directory / f)) for f in files]
        message = commit_message or (f"hfexport: {model.backend} artifact of {model.manifest.get('model_class', '?')}"
                                     + (f" in {prefix}/" if prefix else ""))
        return api.create_commit(repo_id, operations, commit_message=message, revision=revision, token=token)
