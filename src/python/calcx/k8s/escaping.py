"""Turning arbitrary text into YAML scalars and Kubernetes names that cannot change a manifest.

Every templated value is written as a JSON string, which YAML reads as a double-quoted scalar:
quotes, newlines, `: `, `#`, `---` and `{{ }}` stay inside the string. Characters that YAML does
not allow raw in a stream or would read as line breaks (C0/C1 controls, DEL, U+2028/U+2029,
U+FEFF, U+FFFE/U+FFFF) are written as escapes. Which env values a Job may carry at all is
`calcx.contract.env.env_problem`, applied by the renderer.
"""

from __future__ import annotations

import hashlib
import json
import re

_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class UnsafeValueError(ValueError):
    """A value that cannot be placed into a manifest as given."""


def _yaml_unsafe(ch: str) -> bool:
    code = ord(ch)
    if code < 0x20 or code == 0x7F or 0x80 <= code <= 0x9F:
        return True
    # U+2028/U+2029 are line breaks to YAML: raw inside a quoted scalar they would be folded.
    return code in (0x2028, 0x2029, 0xFEFF, 0xFFFE, 0xFFFF) or 0xD800 <= code <= 0xDFFF


def yaml_quote(value: object) -> str:
    """`value` as a double-quoted scalar that YAML (PyYAML, Go yaml) and JSON read back exactly."""
    if not isinstance(value, str):
        raise UnsafeValueError(f"only strings are quoted; got {type(value).__name__} {value!r}")
    for ch in value:
        if 0xD800 <= ord(ch) <= 0xDFFF:
            raise UnsafeValueError(
                f"text contains a lone surrogate U+{ord(ch):04X} (not valid Unicode); fix the input encoding"
            )
    text = json.dumps(value, ensure_ascii=False)
    if not any(_yaml_unsafe(ch) for ch in text):
        return text
    return "".join(f"\\u{ord(ch):04x}" if _yaml_unsafe(ch) else ch for ch in text)


def yaml_int(value: object) -> str:
    """A non-negative integer literal; anything else is an error (no text smuggled as a number)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UnsafeValueError(f"expected a non-negative int, got {value!r}")
    return str(value)


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:length]


def label_value(text: str) -> str:
    """A valid label value for `text`: itself when already valid, else a readable slug plus a hash.

    Distinct inputs map to distinct outputs unless they are valid and equal, or collide in a
    10-hex-digit sha256 prefix. The exact text goes into an annotation alongside.
    """
    if len(text) <= 63 and _LABEL_VALUE_RE.match(text):
        return text
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:52].strip("-_.")
    suffix = _digest(text, 10)
    return f"{slug}-{suffix}" if slug else f"h-{suffix}"


def dns_label(prefix: str, *parts: str, max_len: int = 63) -> str:
    """A DNS-1123 label `prefix-<slug>-<hash>` unique to `parts`, at most `max_len` characters."""
    joined = "/".join(parts)
    suffix = _digest(joined, 10)
    slug = re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")
    room = max_len - len(prefix) - len(suffix) - 2
    slug = slug[: max(room, 0)].strip("-")
    name = f"{prefix}-{slug}-{suffix}" if slug else f"{prefix}-{suffix}"
    assert _DNS_LABEL_RE.match(name) and len(name) <= max_len, name
    return name
