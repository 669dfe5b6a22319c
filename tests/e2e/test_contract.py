"""The contract's own conventions, checked on docs/api/openapi.yaml itself (no sbxd needed), so a
route or field added later keeps them; test_openapi_fuzz.py then checks sbxd against it.

- "a `null` value for an optional field means the same as leaving the field out": every
  optional property of every JSON request body is `nullable` (schemathesis otherwise sends null
  as invalid data and expects a 400 that sbxd, rightly, does not give);
- a `text/event-stream` answer describes one event (SseEvent), which is how schemathesis and
  OpenAPI 3.0 tools read it, not the stream as one string;
- operationIds are unique (the port relay's methods share one text through YAML merge keys).
"""

from __future__ import annotations

from collections import Counter

import yaml

from conftest import REPO

SPEC = REPO / "docs/api/openapi.yaml"


def spec() -> dict:
    return yaml.safe_load(SPEC.read_text())


def operations(d: dict):
    for path, item in d["paths"].items():
        for method, op in item.items():
            if method in ("get", "put", "post", "delete", "patch", "head", "options", "trace"):
                yield method.upper(), path, op


def test_every_optional_request_field_is_nullable():
    d = spec()
    schemas = d["components"]["schemas"]
    seen: set[str] = set()
    missing: list[str] = []

    def resolve(s):
        while isinstance(s, dict) and "$ref" in s:
            s = schemas[s["$ref"].rsplit("/", 1)[-1]]
        return s

    def walk(node, where: str) -> None:
        if isinstance(node, dict) and "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            if name in seen:
                return
            seen.add(name)
            where = name
        s = resolve(node)
        if not isinstance(s, dict):
            return
        for combinator in ("allOf", "oneOf", "anyOf"):
            for i, sub in enumerate(s.get(combinator, [])):
                walk(sub, f"{where}/{combinator}[{i}]")
        required = set(s.get("required") or [])
        for name, prop in (s.get("properties") or {}).items():
            if name not in required and not (prop.get("nullable") or resolve(prop).get("nullable")):
                missing.append(f"{where}.{name}")
            walk(prop, f"{where}.{name}")
        if "items" in s:
            walk(s["items"], f"{where}[]")

    for method, path, op in operations(d):
        for ctype, media in ((op.get("requestBody") or {}).get("content") or {}).items():
            if "json" in ctype and "schema" in media:
                walk(media["schema"], f"{method} {path}")
    assert not missing, ("optional request fields without `nullable: true` (the convention says "
                         "null means left out; a $ref needs `nullable` beside an `allOf`): "
                         + ", ".join(missing))


def test_event_streams_describe_one_event():
    d = spec()
    found = []

    def check(media: dict, where: str) -> None:
        schema = media.get("schema") or {}
        refs = [s.get("$ref") for s in schema.get("allOf", [])] + [schema.get("$ref")]
        assert "#/components/schemas/SseEvent" in refs, f"{where}: {schema}"
        found.append(where)

    def look(responses: dict, where: str) -> None:
        for status, resp in responses.items():
            if "$ref" in resp:
                resp = d["components"]["responses"][resp["$ref"].rsplit("/", 1)[-1]]
            media = (resp.get("content") or {}).get("text/event-stream")
            if media is not None:
                check(media, f"{where} -> {status}")

    for method, path, op in operations(d):
        look(op.get("responses") or {}, f"{method} {path}")
    assert len(found) >= 3, found  # attach, a file watch, an operation's events


def test_operation_ids_are_unique():
    d = spec()
    counts = Counter(op.get("operationId") for _, _, op in operations(d))
    assert not [k for k, n in counts.items() if n > 1 or k is None], counts
