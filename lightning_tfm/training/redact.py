"""The one place secrets are masked: storage URLs, config/summary values, error text, command lines; and the one way
a secret reaches a child process that writes its parameters down (a report's notebook): :func:`hide`, :func:`reveal`.

Anything that goes to a file, a log, the terminal or W&B passes through :func:`scrub` (nested data and
free text) or :func:`mask_url` (one URL). A URL is masked by *parsing* it (SQLAlchemy's ``make_url``),
so a password holding ``@``, ``:`` or ``/`` is masked whole, not just up to its first odd character.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping

MASK = "***"

# A key is secret when one of its words (split on . _ - / and spaces, lower case) is one of these.
# Word matching, not substring matching: "train.batch_tokens" and "d_k" are not secrets.
_SECRET_WORDS = {"key", "apikey", "password", "passwd", "pwd", "token", "secret", "secrets", "credential",
                 "credentials", "auth"}
# scheme://user:PASSWORD@host in free text: greedy up to the last "@" of the word, so a password holding
# an unencoded "@" or "/" is masked whole (masking a little of the host too is the safe side to err on)
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:)(\S*)(@)")
# ?password=...&token=... in query strings and "key=value" text
_KV_SECRET = re.compile(r"(?i)\b((?:api[_-]?key|password|passwd|pwd|token|secret|access[_-]?token)=)([^&\s;]+)")
# Environment variables whose values are masked wherever they appear: narrower than _SECRET_WORDS, since
# PWD (the working directory) and SSH_AUTH_SOCK (a socket path) are not secrets and appear in paths.
_ENV_SECRET_WORDS = {"key", "apikey", "password", "passwd", "token", "secret"}


def is_secret_key(key: str) -> bool:
    """True when a config/summary key names a secret (``WANDB_API_KEY``, ``db.password``, ``auth_token``)."""
    words = re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(key)).lower())
    return any(w in _SECRET_WORDS for w in words)


def _split_userinfo(url: str) -> tuple[str, str, str | None, str] | None:
    """(scheme://, user, password or None, host-and-rest) of ``url``; the user information ends at the
    *last* "@", so an unencoded "@" in the password stays in the password. None when there is none."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.\-]*://)(.*)@(.*)$", url, re.S)
    if not m or "/" in m.group(2).split(":", 1)[0]:
        return None
    user, sep, password = m.group(2).partition(":")
    return m.group(1), user, password if sep else None, m.group(3)


def url_password(url: str) -> str | None:
    """The password of a storage URL as written (percent-encoded or not), or None."""
    parts = _split_userinfo(url)
    return parts[2] if parts and parts[2] else None


def mask_url(url: str) -> str:
    """``postgresql://alice:s3cr@tPW@host/db`` -> ``postgresql://alice:***@host/db``, whatever the password
    holds. SQLAlchemy's ``make_url`` reads a URL with one "@" (its ``render_as_string(hide_password=True)``
    is the masked form); with several "@" it would take the first as the end of the password and show
    the rest as the host, so the user information is taken up to the last "@" instead."""
    parts = _split_userinfo(url)
    if parts is None or parts[2] is None:
        return url
    scheme, user, password, rest = parts
    if "@" not in password:
        try:
            from sqlalchemy.engine import make_url
            return make_url(url).render_as_string(hide_password=True)
        except Exception:  # not a URL SQLAlchemy reads (e.g. an https:// link): mask it by hand
            pass
    return f"{scheme}{user}:{MASK}@{rest}"


def _url_secrets(url: str | None) -> list[str]:
    """The password of ``url`` in every spelling a message may quote it in."""
    pw = url_password(url) if url else None
    if not pw:
        return []
    from urllib.parse import unquote
    # as written and decoded (a driver's message may quote either) ... or a piece of it: given
    # postgresql://u:s3cr@tPW@host, the driver reads host "tPW@host"
    return [pw, unquote(pw)] + [piece for piece in re.split(r"[@:/]", unquote(pw)) if len(piece) >= 3]


def scrub_text(text: str, url: str | None = None) -> str:
    """``text`` with URL passwords, ``password=...`` pairs, secret environment values and, when given, the
    password of ``url`` (however it appears in the text, e.g. inside a driver's error message) masked."""
    return _scrub_str(text, _known_secret_values() + _url_secrets(url))


def _known_secret_values() -> list[str]:
    """Secret values from the environment (e.g. WANDB_API_KEY's) that must never be written anywhere,
    whatever key or text holds them."""
    return [v for k, v in os.environ.items()
            if v and len(v) >= 8 and set(re.split(r"[^a-z0-9]+", k.lower())) & _ENV_SECRET_WORDS]


def scrub(obj: Any, urls: tuple[str, ...] | list[str] = ()) -> Any:
    """A copy of ``obj`` (dict / list / tuple / str / scalar) with secrets masked as ``***``.

    Masks: values under secret-looking keys (key, password, token, secret, ...), the password of any URL
    (``postgresql://user:pw@host/db`` -> ``postgresql://user:***@host/db``), ``password=...``-style pairs,
    and any occurrence of a secret environment variable's value (e.g. the WANDB_API_KEY itself).
    Use it on anything that goes to a file, a log or W&B. ``urls``: storage URLs whose passwords are also
    masked wherever they appear (as :func:`scrub_text` does for one).
    """
    return _scrub(obj, _known_secret_values() + [s for url in urls for s in _url_secrets(url)])


def _scrub(obj: Any, env_secrets: list[str]) -> Any:
    if isinstance(obj, Mapping):
        return {k: (MASK if is_secret_key(k) and obj[k] not in (None, "") else _scrub(v, env_secrets))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_scrub(v, env_secrets) for v in obj)
    if isinstance(obj, str):
        return _scrub_str(obj, env_secrets)
    return obj


def _scrub_str(text: str, secrets: list[str]) -> str:
    s = _URL_PASSWORD.sub(lambda m: m.group(1) + MASK + m.group(3), text)
    s = _KV_SECRET.sub(lambda m: m.group(1) + MASK, s)
    for value in sorted(secrets, key=len, reverse=True):
        s = s.replace(value, MASK)
    return s


# ---------------------------------------------------------------------------------------------------------
# Secrets a child process needs, without writing them down
# ---------------------------------------------------------------------------------------------------------
# The environment variable that carries the real values of parameters shown masked (JSON: name -> value).
# Its name holds no secret word on purpose: scrub masks the values themselves, not this carrier.
HIDDEN_ENV = "LTFM_HIDDEN_PARAMETERS"


def hide(parameters: Mapping[str, Any]) -> tuple[dict, dict[str, str]]:
    """(``parameters`` with every string that holds a secret masked, {name: real value} of those): what a
    child may write down (papermill writes its parameters into the notebook twice), and what it gets through
    :data:`HIDDEN_ENV` instead (:func:`reveal`)."""
    shown, hidden = dict(parameters), {}
    for name, value in parameters.items():
        if isinstance(value, str) and scrub(value) != value:
            shown[name], hidden[name] = scrub(value), value
    return shown, hidden


def hidden_environment(hidden: Mapping[str, str]) -> str:
    """The value of :data:`HIDDEN_ENV` that gives a child ``hidden`` (read back by :func:`reveal`)."""
    import json
    return json.dumps(dict(hidden))


def reveal(name: str, shown: Any) -> Any:
    """In the child: the real value of parameter ``name`` that :func:`hide` masked as ``shown`` (taken from
    :data:`HIDDEN_ENV`), else ``shown`` as it is (a parameter given in the clear, or a notebook run by hand)."""
    import json
    try:
        real = json.loads(os.environ.get(HIDDEN_ENV) or "{}").get(name)
    except (ValueError, AttributeError):
        return shown
    return real if isinstance(real, str) and shown is not None and scrub(real) == shown else shown
