"""The one place secrets are masked: storage URLs, config/summary values, error text, command lines; and the one way
a secret reaches a child process that writes its parameters down (a report's notebook): :func:`hide`, :func:`reveal`.

Anything that goes to a file, a log, the terminal or W&B passes through :func:`scrub` (nested data and
free text), :func:`scrub_text` (a message; every one-line error of ``ltfm`` does) or :func:`mask_url` (one URL or
libpq keyword DSN). Every form a secret takes in one is masked by the same rules: the password of the user
information (up to the *last* "@", so a password holding ``@``, ``:``, ``/`` or a blank is masked whole), and the
value of every ``key=value`` pair whose key names a secret (:func:`is_secret_key`: ``password``, ``sslpassword``,
``token``, ``api_key``, ``key``, ...; percent-encoded keys read decoded), in a URL's query (up to the next ``&``,
blanks included) or a DSN, quoted or not. Free text cannot tell where a URL ends: a text that is one value (a config
value, an argument; :func:`whole_secrets`) is read whole, and an error of ``ltfm`` is masked of its command line's
secrets too (``scrub_text(..., args=argv)``), so a blank in a password never ends what is masked.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping

MASK = "***"

# A key is secret when one of its words (split on . _ - / and spaces, lower case) is one of these, or ends with one
# of _SECRET_ENDINGS (libpq's "sslpassword", "authtoken", "clientsecret"). Word matching, not substring matching:
# "train.batch_tokens", "passwordless" and "d_k" are not secrets. ("passfile" names a file, not a secret.)
_SECRET_WORDS = {"key", "apikey", "password", "passwd", "pwd", "token", "secret", "secrets", "credential",
                 "credentials", "auth"}
_SECRET_ENDINGS = ("password", "passwd", "passphrase", "token", "secret", "apikey")
# scheme://user:PASSWORD@host in free text: greedy up to the last "@" of the line, so a password holding an
# unencoded "@", "/" or blank (libpq and SQLAlchemy take "u:my pw@host") is masked whole (masking some of what
# follows too is the safe side to err on); a password masked already ("u:***@host") is left as it is, so that a
# line quoting a masked URL keeps what follows it
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:)(\*\*\*(?=@)|[^\n]*)(@)")
# A text that is one value (a config value, an argument, a notebook parameter), maybe after "key=": a URL is
# masked by mask_url's rules, which know where its parts end (a query value runs to the next "&", blanks included);
# the value of a secret key is masked whole, blanks included
_WHOLE = re.compile(r"^(?:([\w.\-]+)=)?([^\n]*)$")
# one key=value pair of a URL's query: the value runs to the next "&" (blanks and quotes included)
_QUERY_PAIR = re.compile(r"(^|&)([^&=]*)(=)([^&]*)")
# key=value pairs wherever they stand: a URL's query (?password=..&token=..), a libpq keyword DSN
# ("host=h password = 'p w'"), an override (wandb.api_key=...). The key may be percent-encoded (pass%77ord);
# whether it is secret is decided on its decoded form (:func:`is_secret_key`). A value is quoted ('..' with \'
# escapes, as libpq reads it; an unclosed quote masks the rest) or runs to the next & or blank (masking too much,
# never too little).
_PAIR = re.compile(r"""(?<![\w%.\-])([\w%.\-]+)(\s*=\s*)((?:'(?:\\.|[^'\\])*'?|"(?:\\.|[^"\\])*"?|[^&\s'"]+)+)""")
# Environment variables whose values are masked wherever they appear: narrower than _SECRET_WORDS, since
# PWD (the working directory) and SSH_AUTH_SOCK (a socket path) are not secrets and appear in paths.
_ENV_SECRET_WORDS = {"key", "apikey", "password", "passwd", "token", "secret"}


def is_secret_key(key: str) -> bool:
    """True when a config/summary key or a URL/DSN parameter names a secret (``WANDB_API_KEY``, ``db.password``,
    ``auth_token``, ``sslpassword``, ``pass%77ord``: percent-encoded keys are read decoded)."""
    from urllib.parse import unquote

    words = re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", unquote(str(key))).lower())
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_ENDINGS) for w in words)


def _query_pairs(query: str) -> list[tuple[str, str]]:
    """(key, value as written) of each pair of a URL's query."""
    return [(m.group(2), m.group(4)) for m in _QUERY_PAIR.finditer(query)]


def _mask_query(query: str) -> str:
    return _QUERY_PAIR.sub(lambda m: m.group(1) + m.group(2) + m.group(3) + (MASK if is_secret_key(m.group(2)) and
                                                                              m.group(4) else m.group(4)), query)


def _split_userinfo(url: str) -> tuple[str, str, str | None, str] | None:
    """(scheme://, user, password or None, host-and-rest) of ``url``; the user information ends at the
    *last* "@", so an unencoded "@" in the password stays in the password. None when there is none."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.\-]*://)(.*)@(.*)$", url, re.S)
    if not m or "/" in m.group(2).split(":", 1)[0]:
        return None
    user, sep, password = m.group(2).partition(":")
    return m.group(1), user, password if sep else None, m.group(3)


def url_password(url: str) -> str | None:
    """The password of a storage URL's user information as written (percent-encoded or not), or None."""
    parts = _split_userinfo(url)
    return parts[2] if parts and parts[2] else None


def _secret_pairs(text: str) -> list[str]:
    """The values of the secret key=value pairs in ``text`` (quotes taken off), as written."""
    values = []
    for m in _PAIR.finditer(text):
        if is_secret_key(m.group(1)):
            v = m.group(3)
            values.append(v[1:-1] if len(v) >= 2 and v[0] in "'\"" and v[-1] == v[0] else v.strip("'\""))
    return [v for v in values if v]


def _mask_pairs(text: str) -> str:
    return _PAIR.sub(lambda m: m.group(1) + m.group(2) + MASK if is_secret_key(m.group(1)) else m.group(0), text)


def mask_url(url: str) -> str:
    """A storage URL or DSN as it may be shown: every secret in it replaced by ``***``, whatever form it takes.

    ``postgresql://alice:s3cr@tPW@host/db`` -> ``postgresql://alice:***@host/db`` (the user information ends at
    the *last* "@": a password holding "@", ":" or "/" is masked whole); ``...db?password=PW&sslpassword=K``
    -> ``...db?password=***&sslpassword=***`` (any secret query key, percent-encoded or not: libpq and
    SQLAlchemy read the password from the query too); a libpq keyword DSN ``host=h password='p w'`` ->
    ``host=h password=***``. Every URL or DSN the project prints or writes passes through here (or through
    :func:`scrub` / :func:`scrub_text`, which use the same rules on free text)."""
    if not isinstance(url, str):
        return url
    # a raw "@" in a query value reads as the end of user information: the query's secrets as the first "?" begins
    # it are masked too, after the rules below
    other = [v for k, v in _query_pairs(url.partition("?")[2]) if v and is_secret_key(k)] if "://" in url else []
    masked = _mask_url(url)
    for value in sorted(other, key=len, reverse=True):
        masked = masked.replace(value, MASK)
    return masked


def _mask_url(url: str) -> str:
    parts = _split_userinfo(url)
    if parts is not None and parts[2] is not None:
        scheme, user, _, rest = parts
        url = f"{scheme}{user}:{MASK}@{rest}"
    if "://" in url:  # a URL: the secrets are in its query (a path such as sqlite:///a=b.db is shown as it is)
        head, sep, query = url.partition("?")
        return head + sep + _mask_query(query)
    return _mask_pairs(url)  # a keyword DSN, or any other text


def _url_secrets(url: str | None) -> list[str]:
    """The secrets of ``url`` (its password, its secret query values) in every spelling a message may quote them
    in: as written, decoded (a driver's message may quote either) ... or a piece of one: given
    postgresql://u:s3cr@tPW@host, the driver reads host "tPW@host"."""
    if not url or not isinstance(url, str):
        return []
    from urllib.parse import unquote, unquote_plus

    found = []
    pw = url_password(url)
    if pw:
        found += [pw, unquote(pw)] + [piece for piece in re.split(r"[@:/\s]", unquote(pw)) if len(piece) >= 3]
    values = [v for k, v in _query_pairs(url.partition("?")[2]) if is_secret_key(k)] if "://" in url else \
        _secret_pairs(url)
    for value in values:
        found += [value, unquote(value), unquote_plus(value), re.sub(r"\\(.)", r"\1", value)]
        found += [piece for v in (value, unquote_plus(value)) for piece in re.split(r"\s", v) if len(piece) >= 3]
    return list(dict.fromkeys(s for s in found if s and s != MASK))


def scrub_text(text: str, url: str | None = None, args: list[str] | tuple[str, ...] = ()) -> str:
    """``text`` with URL passwords, secret ``key=value`` pairs, secret environment values and, when given, the
    secrets of ``url`` (however they appear in the text, e.g. inside a driver's error message) masked; and those of
    each of ``args`` (a command line, which an argument error quotes: :func:`whole_secrets`)."""
    return _scrub_str(text, _known_secret_values() + _url_secrets(url) + [s for a in args for s in whole_secrets(a)])


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


def whole_secrets(text: str) -> list[str]:
    """The secrets of ``text`` taken as one value, maybe after ``key=`` (an argument, a config value): the value
    itself when the key names a secret (``wandb.api_key=a b``), else the secrets of the URL or DSN it is (the
    password ``my pw`` of ``postgresql://u:my pw@h/db``), blanks included."""
    whole = _WHOLE.match(text.strip())
    if not whole:
        return []
    key, value = whole.groups()
    if key and is_secret_key(key):
        return [value] if value and value != MASK else []
    return _url_secrets(value) if re.match(r"[A-Za-z][A-Za-z0-9+.\-]*://", value) else []


def _scrub_str(text: str, secrets: list[str]) -> str:
    secrets = secrets + whole_secrets(text)  # a value's own secrets, wherever they stand in it
    s = text
    for value in sorted(secrets, key=len, reverse=True):  # the known values first, whole (a pair's rule below may
        s = s.replace(value, MASK)                         # end a value at a blank)
    s = _URL_PASSWORD.sub(lambda m: m.group(1) + MASK + m.group(3), s)
    return _mask_pairs(s)


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
