"""``$ref`` resolution inside one schema document: JSON pointers, ``$anchor`` names and
``$id``-identified subschemas (no remote documents are fetched).

A schema names its parts three ways: ``#/$defs/item`` (a pointer from the document root),
``#item`` (an ``$anchor``, or a draft 6/7 ``"$id": "#item"``), and ``item.json`` (a
subschema whose ``$id`` is that URI, relative to the ``$id``s around it). The index maps
every such absolute URI to its subschema, and each subschema object to its base URI (the
translator keeps the base of the schema it is in, and reads a ``$ref`` against it), so
``{"$id": "https://x/a.json", ... {"$ref": "b.json"}}`` finds the part whose ``$id``
resolves to ``https://x/b.json``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

_DATA_KEYWORDS = ("enum", "const", "default", "examples")  # values, not subschemas: not indexed


class UnresolvedRef(ValueError):
    """A ``$ref`` that names nothing in the document (or another document)."""


class RefIndex:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.root_base = ""
        self.by_uri: dict[str, Any] = {}  # absolute URI (no fragment, or an anchor's) -> subschema
        self.base_of: dict[int, str] = {}  # id(subschema) -> its base URI
        if isinstance(root, dict) and isinstance(root.get("$id"), str):
            self.root_base = urldefrag(root["$id"])[0]
        self._index(root, self.root_base)

    def _index(self, node: Any, base: str) -> None:
        if isinstance(node, list):
            for item in node:
                self._index(item, base)
            return
        if not isinstance(node, dict):
            return
        ident = node.get("$id")
        if isinstance(ident, str):
            uri, fragment = _join(base, ident)
            if fragment:  # draft 6/7 "$id": "#name": an anchor in the current document
                self.by_uri[f"{uri}#{fragment}"] = node
            else:
                self.by_uri.setdefault(uri, node)
                base = uri
        if isinstance(node.get("$anchor"), str):
            self.by_uri[f"{base}#{node['$anchor']}"] = node
        self.base_of[id(node)] = base
        for key, value in node.items():
            if key not in _DATA_KEYWORDS:
                self._index(value, base)

    def resolve(self, ref: Any, base: str | None = None) -> tuple[Any, str]:
        """The subschema ``ref`` names, read against ``base`` (the root's by default), and a
        canonical key for it (equal keys: one target)."""
        if not isinstance(ref, str):
            raise UnresolvedRef(f"$ref must be a string, got {type(ref).__name__}")
        base = self.root_base if base is None else base
        uri, fragment = _join(base, ref)
        fragment = unquote(fragment)
        if fragment and not fragment.startswith("/"):
            target = self.by_uri.get(f"{uri}#{fragment}")
            if target is None:
                raise UnresolvedRef(
                    f"$ref {ref!r}: no $anchor (or $id) named {fragment!r} in the schema"
                )
            return target, f"{uri}#{fragment}"
        if uri == self.root_base:
            return _pointer(self.root, fragment, ref), f"{uri}#{fragment}"
        if uri not in self.by_uri:
            raise UnresolvedRef(
                f"$ref {ref!r} is not supported: it names another document ({uri}); only "
                "references within the schema ('#/$defs/...', '#anchor', or a subschema's $id) are"
            )
        try:
            return _pointer(self.by_uri[uri], fragment, ref), f"{uri}#{fragment}"
        except UnresolvedRef:
            if not ref.startswith("#"):
                raise
            # '#/...' under a nested $id that is really an annotation (generated schemas put
            # "$id": "/properties/x" on every part): the pointer from the document root
            return _pointer(self.root, fragment, ref), f"{self.root_base}#{fragment}"


def _join(base: str, ref: str) -> tuple[str, str]:
    """``ref`` against ``base``, as (absolute URI, fragment). A fragment alone stays in
    ``base`` whatever its scheme (urljoin leaves "#..." as it is under a base like "urn:x")."""
    if ref.startswith("#"):
        return base, ref[1:]
    uri, fragment = urldefrag(urljoin(base, ref))
    return uri, fragment


def _pointer(node: Any, pointer: str, ref: str) -> Any:
    for token in pointer.split("/")[1:] if pointer else []:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise UnresolvedRef(f"$ref {ref!r} does not resolve")
    return node
