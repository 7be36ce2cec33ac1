"""``@gatehouse.tool``: Python callables as MCP tools.

The input schema comes from the type hints (or ``input_schema=``); arguments are checked
against it before the function runs; the return value becomes a ``CallToolResult``: ``str`` →
one text block, ``dict`` → structured content (and its JSON as text), a list of content blocks
→ those blocks. A raising tool gives ``isError: true`` with the exception's message; the
traceback goes to the ``gatehouse.tools`` logger, never to the agent.
"""

from __future__ import annotations

import asyncio
import collections.abc
import inspect
import json
import logging
import types
import typing
from typing import Any, Callable

from . import _native
from ._errors import InvalidTool

log = logging.getLogger("gatehouse.tools")

CallContext = _native.CallContext

_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _schema_of(tp: Any) -> dict[str, Any]:
    if tp is inspect.Parameter.empty or tp is Any or tp is object:
        return {}
    if tp is type(None):
        return {"type": "null"}
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        inner = _schema_of(args[0])
        for extra in args[1:]:
            if isinstance(extra, str):
                inner["description"] = extra
            elif isinstance(extra, dict):
                inner.update(extra)
        return inner
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin is typing.Union or origin is types.UnionType:
        members = [_schema_of(a) for a in args]
        return {"anyOf": members}
    if tp is dict or origin in (dict, collections.abc.Mapping):
        s: dict[str, Any] = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            s["additionalProperties"] = _schema_of(args[1])
        return s
    if tp in (list, tuple, set, frozenset) or origin in (
        list,
        tuple,
        set,
        frozenset,
        collections.abc.Sequence,
    ):
        s = {"type": "array"}
        if args and not (origin is tuple and len(args) != 2 and args[-1] is not Ellipsis):
            s["items"] = _schema_of(args[0])
        return s
    schema_fn = getattr(tp, "model_json_schema", None)  # pydantic models
    if callable(schema_fn):
        return typing.cast(dict[str, Any], schema_fn())
    if typing.is_typeddict(tp):
        hints = typing.get_type_hints(tp)
        return {
            "type": "object",
            "properties": {k: _schema_of(v) for k, v in hints.items()},
            "required": sorted(getattr(tp, "__required_keys__", hints.keys())),
        }
    raise InvalidTool(
        f"cannot derive a JSON Schema from the type hint {tp!r}; use str, int, float, bool, "
        "list[...], dict[...], Literal[...], Optional[...], a TypedDict, or pass input_schema="
    )


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def _type_ok(value: Any, t: str) -> bool:
    if t in ("integer", "number") and isinstance(value, bool):
        return False
    if t == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _JSON_TYPES.get(t, (object,)))


def check(schema: Any, value: Any, path: str = "arguments") -> str | None:
    """The first way ``value`` breaks ``schema`` (a JSON Schema subset), or None."""
    if not isinstance(schema, dict) or not schema:
        return None
    t = schema.get("type")
    if t is not None:
        types_ = t if isinstance(t, list) else [t]
        if not any(_type_ok(value, x) for x in types_):
            return f"{path}: expected {' or '.join(types_)}, got {type(value).__name__}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path}: must be one of {schema['enum']!r}"
    if "const" in schema and value != schema["const"]:
        return f"{path}: must be {schema['const']!r}"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            if all(check(s, value, path) is not None for s in schema[key]):
                return f"{path}: matches none of the allowed forms"
    for s in schema.get("allOf", []):
        err = check(s, value, path)
        if err:
            return err
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            return f"{path}: shorter than {schema['minLength']} characters"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{path}: longer than {schema['maxLength']} characters"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{path}: less than {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{path}: greater than {schema['maximum']}"
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                return f"{path}: {name!r} is required"
        extra = schema.get("additionalProperties", True)
        for k, v in value.items():
            if k in props:
                err = check(props[k], v, f"{path}.{k}")
            elif extra is False:
                err = f"{path}: unexpected argument {k!r} (allowed: {', '.join(sorted(props))})"
            else:
                err = check(extra, v, f"{path}.{k}") if isinstance(extra, dict) else None
            if err:
                return err
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            err = check(schema["items"], v, f"{path}[{i}]")
            if err:
                return err
    return None


_EXACT: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}
_PLAIN_KEYS = {"type", "description", "title", "default", "examples"}


def fast_check(schema: Any) -> Callable[[Any], bool] | None:
    """A quick yes for arguments that surely pass ``check(schema, ...)``, for the common schema
    (an object whose properties have at most a single JSON type each); False means "ask
    ``check``" (which finds the message), never "invalid". None when the schema is not of
    that form."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None
    if set(schema) - {"type", "properties", "required", "additionalProperties", "description", "title"}:
        return None
    props = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(props, dict) or not isinstance(required, list) or extra not in (True, False):
        return None
    types_: dict[str, tuple[type, ...] | None] = {}
    for name, p in props.items():
        if not isinstance(p, dict) or set(p) - _PLAIN_KEYS:
            return None
        t = p.get("type")
        if t is None:
            types_[name] = None
        elif isinstance(t, str) and t in _EXACT:
            types_[name] = _EXACT[t]
        else:
            return None
    required_ = tuple(required)
    allow_extra = extra is True

    def ok(args: Any) -> bool:
        # Exact types only (what JSON decodes to); a bool is never an integer here.
        if type(args) is not dict:
            return False
        for name in required_:
            if name not in args:
                return False
        for k, v in args.items():
            if k in types_:
                want = types_[k]
                if want is not None and type(v) not in want:
                    return False
            elif not allow_extra:
                return False
        return True

    return ok


def to_result(value: Any) -> dict[str, Any]:
    """A tool's return value as a ``CallToolResult``."""
    if isinstance(value, str):
        return {"content": [{"type": "text", "text": value}]}
    if value is None:
        return {"content": []}
    if isinstance(value, dict):
        return {
            "content": [{"type": "text", "text": json.dumps(value, default=str)}],
            "structuredContent": value,
        }
    if isinstance(value, (list, tuple)) and all(
        isinstance(b, dict) and isinstance(b.get("type"), str) for b in value
    ):
        return {"content": list(value)}
    dump = getattr(value, "model_dump", None)  # e.g. an mcp.types content block
    if callable(dump):
        return {"content": [dump(mode="json", exclude_none=True, by_alias=True)]}
    return {"content": [{"type": "text", "text": json.dumps(value, default=str)}]}


def error_result(message: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": message}], "isError": True}


class Tool:
    """A Python function served as an MCP tool. Calling it calls the function."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        input_schema: dict[str, Any] | None = None,
        annotations: dict[str, Any] | None = None,
    ) -> None:
        if not callable(fn):
            raise InvalidTool(f"@gatehouse.tool needs a function, got {fn!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or ""
        doc = inspect.getdoc(fn) or ""
        self.description = description if description is not None else doc.strip()
        self.annotations = annotations
        self.is_async = inspect.iscoroutinefunction(fn)
        sig = inspect.signature(fn)
        try:
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception as e:  # unresolvable forward references
            raise InvalidTool(f"tool {self.name!r}: cannot read its type hints ({e})") from e
        self._ctx_param: str | None = None
        self._var_kw = False
        props: dict[str, Any] = {}
        required: list[str] = []
        for p in sig.parameters.values():
            hint = hints.get(p.name, p.annotation)
            if hint is CallContext or p.name == "ctx":
                self._ctx_param = p.name
                continue
            if p.kind is p.VAR_KEYWORD:
                self._var_kw = True
                continue
            if p.kind is p.VAR_POSITIONAL:
                continue
            if input_schema is None:
                s = _schema_of(hint)
                if p.default is not p.empty:
                    try:
                        json.dumps(p.default)
                        s = {**s, "default": p.default}
                    except TypeError:
                        pass
                props[p.name] = s
            if p.default is p.empty:
                required.append(p.name)
        if input_schema is not None:
            if not isinstance(input_schema, dict) or input_schema.get("type") != "object":
                raise InvalidTool(
                    f"tool {self.name!r}: input_schema must be a JSON Schema object with "
                    '"type": "object"'
                )
            self.input_schema = input_schema
        else:
            self.input_schema = {"type": "object", "properties": props}
            if required:
                self.input_schema["required"] = required
            if not self._var_kw:
                self.input_schema["additionalProperties"] = False
        self._fast_ok = fast_check(self.input_schema)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<gatehouse.Tool {self.name!r}{' async' if self.is_async else ''}>"

    # ---- the call path (runs on a tool thread, or as a task on an event loop)
    #
    # The native side passes the arguments as Python objects (a dict, or None for none) and
    # takes back a ``str`` (the text of a one-text-block result, the common case, built in
    # Rust) or ``bytes`` (the whole ``CallToolResult`` as JSON).

    def _prepare(self, args: Any, ctx: Any) -> tuple[dict[str, Any] | None, str | None]:
        if args is None:
            args = {}
        fast = self._fast_ok
        if fast is None or not fast(args):
            err = check(self.input_schema, args)
            if err:
                return None, f"Invalid arguments for tool {self.name}: {err}"
        if self._ctx_param is not None:
            args[self._ctx_param] = ctx  # a fresh dict per call
        return args, None

    def _failed(self, e: BaseException) -> bytes:
        log.error("tool %s raised %s", self.name, type(e).__name__, exc_info=e)
        return json.dumps(error_result(str(e) or type(e).__name__)).encode()

    def _finish(self, value: Any) -> str | bytes:
        if type(value) is str:
            return value
        try:
            return json.dumps(to_result(value), default=str).encode()
        except Exception as e:
            return self._failed(e)

    def _sync_invoker(self) -> Callable[[Any, Any], str | bytes]:
        """The sync call path as one closure (the per-call work: check, call, encode)."""
        fn, fast, ctx_param = self.fn, self._fast_ok, self._ctx_param
        schema, name, failed, finish = self.input_schema, self.name, self._failed, self._finish

        def invoke(args: Any, ctx: Any) -> str | bytes:
            if args is None:
                args = {}
            if fast is None or not fast(args):
                err = check(schema, args)
                if err:
                    msg = f"Invalid arguments for tool {name}: {err}"
                    return json.dumps(error_result(msg)).encode()
            if ctx_param is not None:
                args[ctx_param] = ctx  # a fresh dict per call
            try:
                value = fn(**args)
            except Exception as e:
                return failed(e)
            if type(value) is str:
                return value
            return finish(value)

        return invoke

    async def _run_async(self, args: dict[str, Any], done: Any) -> None:
        # Reports from inside the task (no done-callback, no extra loop iteration).
        try:
            value = await self.fn(**args)
        except asyncio.CancelledError:
            done.cancelled()  # a no-op when the call ended first (it cancelled the task)
            raise
        except Exception as e:
            done(self._failed(e))
            return
        except BaseException:
            done.cancelled()
            raise
        done(self._finish(value))

    def native(
        self,
        gateway: Any,
        loop: asyncio.AbstractEventLoop | None = None,
        port: Any = None,
    ) -> Any:
        """The `_native.NativeTool` of this tool: a sync one runs on ``gateway``'s tool threads
        (``gateway`` is a ``_native.NativeGateway``); a coroutine one runs on ``loop``, reached
        through its ``port`` (a ``_native.LoopPort`` the loop watches)."""
        wants_ctx = self._ctx_param is not None
        if self.is_async:
            if loop is None or port is None:
                raise InvalidTool(f"tool {self.name!r} is async: it needs an event loop")
            prepare, run, create_task = self._prepare, self._run_async, loop.create_task

            def start(args: Any, ctx: Any, done: Any) -> Any:
                # On the loop's thread (the port's reader callback): the result now (bad
                # arguments), or the task, which reports through `done` itself.
                args, err = prepare(args, ctx)
                if err is not None or args is None:
                    return json.dumps(error_result(err or "bad arguments")).encode()
                return create_task(run(args, done))

            return _native.NativeTool(
                self.name,
                self.description,
                json.dumps(self.input_schema),
                start,
                json.dumps(self.annotations) if self.annotations is not None else None,
                port=port,
                wants_ctx=wants_ctx,
            )
        return _native.NativeTool(
            self.name,
            self.description,
            json.dumps(self.input_schema),
            self._sync_invoker(),
            json.dumps(self.annotations) if self.annotations is not None else None,
            gateway=gateway,
            wants_ctx=wants_ctx,
        )


@typing.overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@typing.overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    input_schema: dict[str, Any] | None = None,
    annotations: dict[str, Any] | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    input_schema: dict[str, Any] | None = None,
    annotations: dict[str, Any] | None = None,
) -> Any:
    """Makes a function an MCP tool: ``@gatehouse.tool`` or ``@gatehouse.tool(description=...)``.

    A parameter annotated ``gatehouse.CallContext`` (or named ``ctx``) receives the call's
    context and is not part of the schema. Sync functions run on worker threads; ``async def``
    functions run on an event loop.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(
            f, name=name, description=description, input_schema=input_schema, annotations=annotations
        )

    return wrap(fn) if fn is not None else wrap
