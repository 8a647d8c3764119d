"""Options declared once, in groups; a spec built from the groups takes and shows their fields flat.

An option group is a frozen keyword-only dataclass that validates itself in ``__post_init__`` (the pipeline's
``EpochOptions``, the launcher's ``Topology``). A class that subclasses :class:`GroupedOptions` names its
groups with :func:`group`; from them it gets, with nothing written twice:

* a keyword argument and a dataclass field per group field, with the group's name, type and default
  (``LaunchConfig(command=..., workers=2)``; ``dataclasses.fields``, ``replace`` and ``repr`` see them);
* each group, built and validated from those arguments, as an attribute (``config.topology``), and the
  flat attributes as the group normalized them (``config.workers``);
* a whole group as an argument too (``tuning=TuningOptions(...)``; flat arguments given as well win);
* the class's error for an unknown name (with "did you mean"), a missing required one, or positional ones;
* :meth:`~GroupedOptions.option_names`, :meth:`~GroupedOptions.option_groups` and
  :meth:`~GroupedOptions.option_values` for code that walks or serializes the options.

The class's own annotated fields (``command``) stay ordinary fields, and its own ``__post_init__`` runs
after the groups are built: that is the place for rules across groups. A group may add a ``prefix`` to its
field names (``ShardOptions.policy`` is the pipeline's ``shard_policy``); errors raised by the group name the
prefixed argument when it is built from flat arguments.

A field declared with :func:`option` also says how a command line offers it (its help, and its flag where
that is not ``--`` plus its name); :func:`flagged_options` lists such fields of any dataclass, a grouped
class's flat ones included, for a CLI to build its flags from (``tfdist-launch``'s are made so).

Example:
    >>> import dataclasses
    >>> from tfdist.errors import LaunchError, require_int
    >>> @dataclasses.dataclass(frozen=True, kw_only=True)
    ... class Retry:
    ...     attempts: int = 3
    ...     def __post_init__(self) -> None:
    ...         require_int(LaunchError, "attempts", self.attempts, minimum=0)
    >>> class Job(GroupedOptions, error=LaunchError):
    ...     name: str
    ...     retry = group(Retry)
    >>> job = Job(name="train", attempts=5)
    >>> job.attempts, job.retry, Job.option_names()
    (5, Retry(attempts=5), ('name', 'attempts'))
    >>> Job(name="train", retry=Retry(attempts=1)).attempts
    1
    >>> Job(name="train", atempts=5)
    Traceback (most recent call last):
    ...
    tfdist.errors.LaunchError: Invalid value for `options`. Received: ['atempts']. Expected keyword options among \
'attempts', 'name', 'retry' (did you mean 'attempts'?).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, overload

from tfdist.errors import Error, check_keywords, invalid

G = TypeVar("G")
_FLAG = "flag"  # The key of a field's Flag in its metadata.


class _Own(enum.Enum):
    DEFAULT = "the option's own default"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Flag:
    """How a command line offers an option: declared with the option itself (:func:`option`).

    Attributes:
      help: One line for ``--help``. Other options are named in backticks (`chief`); a CLI shows their flags.
      name: The flag, where it is not ``--`` plus the option's name with dashes (``--grace`` for
        ``grace_seconds``; ``--kill`` for ``kills``, one event per flag).
      metavar: The value's name in ``--help``.
      choices: The values the flag takes (the option checks them again).
      cli_default: The flag's default, where a command line's is not the option's own (``tfdist-launch
        --workers`` is 2, ``Topology.workers`` 1): declared here, so both stand in one place.
      bare: The value of the flag given without one (``--stall-seconds`` alone is 300); by default the flag
        needs a value.
    """

    help: str
    name: str = ""
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    cli_default: Any = _Own.DEFAULT
    bare: Any = _Own.DEFAULT

    @property
    def takes_bare(self) -> bool:
        """Whether the flag may be given without a value (then it is :attr:`bare`)."""
        return self.bare is not _Own.DEFAULT


def option(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    help: str,
    flag: str = "",
    metavar: str | None = None,
    choices: tuple[str, ...] = (),
    cli_default: Any = _Own.DEFAULT,
    bare: Any = _Own.DEFAULT,
) -> Any:
    """A dataclass field with its default (or ``default_factory``) and how a command line offers it (:class:`Flag`).

    Example:
        >>> @dataclasses.dataclass(frozen=True, kw_only=True)
        ... class Retry:
        ...     attempts: int = option(3, help="tries before giving up", cli_default=5)
        >>> Retry().attempts, [(o.name, o.flag_name(), o.default) for o in flagged_options(Retry)]
        (3, [('attempts', '--attempts', 5)])
        >>> class Job(GroupedOptions):
        ...     retry = group(Retry)
        >>> [(o.name, o.group, o.flag.help) for o in flagged_options(Job)]
        [('attempts', 'retry', 'tries before giving up')]
    """
    about = Flag(help=help, name=flag, metavar=metavar, choices=tuple(choices), cli_default=cli_default, bare=bare)
    return dataclasses.field(default=default, default_factory=default_factory, metadata={_FLAG: about})


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlaggedOption:
    """One field declared with :func:`option`, as a CLI reads it.

    Attributes:
      name: The keyword argument (a grouped class's flat name).
      type: Its type, resolved (``int | None``).
      default: The flag's default: ``cli_default`` if declared, else the option's own.
      flag: How the command line offers it.
      group: The option group it belongs to ('' outside groups).
    """

    name: str
    type: Any
    default: Any
    flag: Flag
    group: str = ""

    def flag_name(self, prefix: str = "") -> str:
        """The flag: the declared one, else ``--`` + ``prefix-`` + the name with dashes (``--ray-address``)."""
        return self.flag.name or "--" + (f"{prefix}-" if prefix else "") + self.name.replace("_", "-")


def flagged_options(kind: type) -> tuple[FlaggedOption, ...]:
    """The fields of the dataclass ``kind`` declared with :func:`option`, in order (see the module docstring)."""
    hints = _hints(kind)
    found = []
    for f in dataclasses.fields(kind):
        about = f.metadata.get(_FLAG)
        if isinstance(about, Flag):
            own = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            default = own if about.cli_default is _Own.DEFAULT else about.cli_default
            hint = hints.get(f.name, f.type)
            found.append(
                FlaggedOption(name=f.name, type=hint, default=default, flag=about, group=f.metadata.get("group", ""))
            )
    return tuple(found)


class OptionGroup(Generic[G]):
    """One option group of a :class:`GroupedOptions` class (what :func:`group` returns).

    Attributes:
      kind: The group's dataclass.
      prefix: Put before each of its field names to make the flat argument names.
      name: The attribute the group is stored under (set when the class is made).
    """

    def __init__(self, kind: type[G], *, prefix: str = "") -> None:
        if not (isinstance(kind, type) and dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen):  # type: ignore[attr-defined]
            raise TypeError(f"an option group is a frozen dataclass, not {kind!r}")
        self.kind, self.prefix, self.name = kind, prefix, ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: Any = None) -> OptionGroup[G]: ...

    @overload
    def __get__(self, obj: object, owner: Any = None) -> G: ...

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        raise AttributeError(f"{type(obj).__name__}.{self.name} is not built yet")  # Set per instance once built.

    def fields(self) -> dict[str, str]:
        """Flat argument name -> the group's field name, in the group's order."""
        return {self.prefix + f.name: f.name for f in dataclasses.fields(self.kind) if f.init}  # type: ignore[arg-type]

    def build(self, values: Mapping[str, Any]) -> G:
        """The group from flat ``values``; its errors name the flat argument."""
        fields = self.fields()
        try:
            return self.kind(**{name: values[flat] for flat, name in fields.items()})
        except Error as err:
            flat = {name: flat for flat, name in fields.items()}.get(err.field or "")
            raise err if flat is None or flat == err.field else _renamed(err, flat) from None


def group(kind: type[G], *, prefix: str = "") -> OptionGroup[G]:
    """Declares an option group in a :class:`GroupedOptions` class body: ``tuning = group(TuningOptions)``."""
    return OptionGroup(kind, prefix=prefix)


def _renamed(err: Error, flat: str) -> Error:
    """``err`` naming ``flat`` (the argument the caller passed) instead of the group's own field."""
    message = err.message.replace(f"`{err.field}`", f"`{flat}`", 1)
    return type(err)(message, field=flat, value=err.value, expected=err.expected, fix=err.fix)


class GroupedOptions:
    """Base of a frozen, keyword-only spec whose options come in groups (see the module docstring).

    Subclass it with the error class for bad input: ``class LaunchConfig(GroupedOptions, error=LaunchError)``.
    The subclass is made a ``dataclass(frozen=True, kw_only=True)``; do not decorate it again.
    """

    _option_groups: ClassVar[dict[str, OptionGroup[Any]]] = {}
    _option_error: ClassVar[type[Error]] = Error
    _own_post_init: ClassVar[Callable[[Any], None] | None] = None

    if TYPE_CHECKING:  # The flat arguments and attributes are made at run time, from the groups.

        def __init__(self, **options: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

    def __init_subclass__(cls, *, error: type[Error] | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        groups = {name: value for name, value in vars(cls).items() if isinstance(value, OptionGroup)}
        annotations = dict(vars(cls).get("__annotations__", {}))
        taken = {*annotations, *cls._option_groups, *getattr(cls, "__dataclass_fields__", {})}
        for grp in groups.values():
            hints = _hints(grp.kind)
            own = {f.name: f for f in dataclasses.fields(grp.kind)}
            for flat, name in grp.fields().items():
                if flat in taken or flat in groups:
                    raise TypeError(f"{cls.__name__}: option {flat!r} is declared twice")
                taken.add(flat)
                f = own[name]
                annotations[flat] = hints.get(name, f.type)
                setattr(
                    cls,
                    flat,
                    dataclasses.field(
                        default=f.default,
                        default_factory=f.default_factory,
                        repr=f.repr,
                        compare=f.compare,
                        metadata={**f.metadata, "group": grp.name},
                    ),
                )
        cls.__annotations__ = annotations
        cls._option_groups = {**cls._option_groups, **groups}  # A subclass keeps its parent's groups.
        cls._option_error = error or cls._option_error
        own_post_init = vars(cls).get("__post_init__") or cls._own_post_init  # Rules across groups, if any.
        cls._own_post_init = own_post_init
        cls.__post_init__ = _post_init(own_post_init)  # type: ignore[attr-defined]
        dataclasses.dataclass(frozen=True, kw_only=True)(cls)
        cls.__init__ = _keyword_init(cls, cls.__init__)  # type: ignore[method-assign]

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """Every keyword argument, in declaration order: the class's own fields, then each group's."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)  # type: ignore[arg-type]

    @classmethod
    def option_groups(cls) -> dict[str, type]:
        """Group attribute -> the group's class, e.g. ``{'topology': Topology, ...}``."""
        return {name: grp.kind for name, grp in cls._option_groups.items()}

    def option_values(self) -> dict[str, Any]:
        """Every keyword argument -> its value here: ``type(self)(**self.option_values())`` is an equal copy."""
        return {name: getattr(self, name) for name in self.option_names()}

    def _replace_options(self, **changes: Any) -> None:
        """For a subclass's ``__post_init__``: sets flat options, rebuilding (and re-validating) their groups."""
        for grp in self._option_groups.values():
            mine = {flat: value for flat, value in changes.items() if flat in grp.fields()}
            if mine:
                self._set_group(grp, grp.build({**{flat: getattr(self, flat) for flat in grp.fields()}, **mine}))

    def _set_group(self, grp: OptionGroup[Any], built: Any) -> None:
        object.__setattr__(self, grp.name, built)
        for flat, name in grp.fields().items():
            object.__setattr__(self, flat, getattr(built, name))  # As the group normalized it (tuples, proxies).


def _hints(kind: type) -> dict[str, Any]:
    """The group's field types, resolved where the group is defined (the class using them may not import them)."""
    try:
        return typing.get_type_hints(kind)
    except (NameError, TypeError):
        return {}


def _post_init(own: Callable[[Any], None] | None) -> Callable[[Any], None]:
    def __post_init__(self: GroupedOptions) -> None:
        for grp in self._option_groups.values():
            self._set_group(grp, grp.build({flat: getattr(self, flat) for flat in grp.fields()}))
        if own is not None:
            own(self)  # Rules across groups, and the class's own fields.

    return __post_init__


def _keyword_init(cls: type[GroupedOptions], init: Callable[..., None]) -> Callable[..., None]:
    """Wraps the dataclass ``__init__``: groups as arguments, and the class's error instead of a TypeError."""
    error = cls._option_error
    fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    names = [f.name for f in fields]
    required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]

    @functools.wraps(init)
    def __init__(self: GroupedOptions, *args: Any, **options: Any) -> None:
        if args:
            raise invalid(error, "options", args, f"keyword arguments, e.g. {cls.__name__}({names[0]}=...)")
        for name, grp in cls._option_groups.items():
            if name in options:
                given = options.pop(name)
                if not isinstance(given, grp.kind):
                    raise invalid(
                        error,
                        name,
                        given,
                        f"a {grp.kind.__name__}",
                        f"Or pass its fields as keyword arguments: {', '.join(grp.fields())}.",
                    )
                for flat, field in grp.fields().items():
                    options.setdefault(flat, getattr(given, field))
        check_keywords(error, "options", options, [*names, *cls._option_groups])
        missing = [name for name in required if name not in options]
        if missing:
            raise invalid(error, missing[0], None, "a value (it has no default)", f"Pass {missing[0]}=...")
        init(self, **options)

    return __init__
