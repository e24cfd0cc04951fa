"""A task's ``when``: a CEL expression over the run's declared parameters (``params``).

Evaluated by ``common-expression-language`` (module ``cel``, CEL in Rust, no I/O functions).
That library has no cost limit and no type checker, so this module bounds what it is given
and checks what it can before any run exists:

- **Bounds.** At most ``MAX_EXPRESSION_LENGTH`` characters, brackets nested at most
  ``MAX_NESTING`` deep and at most ``MAX_COMPREHENSIONS`` comprehension macro (``all``,
  ``exists``, ``exists_one``, ``map``, ``filter``): with a run's parameters capped at 16 KiB
  (`caps.py`), one expression then costs at most one pass over the largest list, times its
  length. Only ``params`` (and the comprehension's own variables) may be named.
- **Type check.** Every ``params.NAME`` / ``params['NAME']`` must be a declared parameter
  (read statically); then the expression is evaluated against typed sample values of the
  declarations (`parameters.sample_values`): a type error (``params.mode > 3`` for a string
  mode) or a result that is not a boolean is refused with the field. A type error only on a
  branch the samples do not reach is still refused when a run is applied, since admission
  evaluates every condition with the run's own parameters (`expansion.expand`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final

from flowforge.domain.errors import DefinitionError, DefinitionSchemaError, UserError
from flowforge.domain.parameters import sample_values
from flowforge.domain.spec_schema import MAX_EXPRESSION_LENGTH

if TYPE_CHECKING:
    from flowforge.domain.models import DefinitionSpec

MAX_NESTING: Final = 16
MAX_COMPREHENSIONS: Final = 1
_MACROS: Final = ("all", "exists", "exists_one", "map", "filter")
_STRING_LITERAL = re.compile(
    r"""[rRbB]*(?:'''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*")""", re.DOTALL
)
_FIELD_REFERENCE = re.compile(r"\bparams\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")
_BARE_REFERENCE = re.compile(r"params\.([A-Za-z_][A-Za-z0-9_]*)")
_INDEX_REFERENCE = re.compile(r"""\bparams\s*\[\s*(?:'((?:\\.|[^'\\])*)'|"((?:\\.|[^"\\])*)")""")
_MACRO_CALL = re.compile(r"\.\s*(" + "|".join(_MACROS) + r")\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)")


class ConditionError(UserError):
    """A ``when`` that cannot be decided: ``path`` names the field (``spec.tasks[i].when``)."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def _without_literals(expression: str) -> str:
    return _STRING_LITERAL.sub('""', expression)


def _bound_problem(expression: str) -> str | None:
    if len(expression) > MAX_EXPRESSION_LENGTH:
        return f"is {len(expression)} characters long; at most {MAX_EXPRESSION_LENGTH}"
    bare = _without_literals(expression)
    depth = deepest = 0
    for character in bare:
        if character in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif character in ")]}":
            depth -= 1
    if deepest > MAX_NESTING:
        return f"nests brackets {deepest} deep; at most {MAX_NESTING}"
    macros = len(_MACRO_CALL.findall(bare))
    if macros > MAX_COMPREHENSIONS:
        return f"uses {macros} comprehensions ({', '.join(_MACROS)}); at most {MAX_COMPREHENSIONS}"
    return None


def referenced_parameters(expression: str) -> set[str]:
    """The parameter names ``expression`` reads, as ``params.NAME`` or ``params['NAME']``."""
    names = set(_FIELD_REFERENCE.findall(_without_literals(expression)))
    for single, double in _INDEX_REFERENCE.findall(expression):
        names.add(single or double)
    return names


@lru_cache(maxsize=1024)
def _program(expression: str) -> Any:
    import cel

    return cel.compile(expression)


def _compile(expression: str, *, path: str) -> Any:
    """The compiled program of a bounded expression that names only ``params``."""
    problem = _bound_problem(expression)
    if problem is not None:
        raise ConditionError(problem, path=path)
    try:
        program = _program(expression)
    except ValueError as error:
        raise ConditionError(f"not a CEL expression: {_first_line(error)}", path=path) from None
    bound = {variable for _, variable in _MACRO_CALL.findall(_without_literals(expression))}
    unknown = sorted(set(program.variables()) - {"params"} - bound)
    if unknown:
        raise ConditionError(
            f"names {', '.join(unknown)}; a condition reads only params.NAME", path=path
        )
    return program


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    if text.startswith("No such overload"):
        return "type error: no operator or function for these operand types (CEL does not "
        "convert between types; convert with int(), double() or string())"
    return text.splitlines()[0] if text else type(error).__name__


def value_of(expression: str, parameters: Mapping[str, Any], *, path: str) -> Any:
    """The value of the bounded expression ``expression`` (over ``params`` only) for a run's
    effective parameters; ConditionError naming ``path`` when it fails."""
    program = _compile(expression, path=path)
    try:
        bare = _BARE_REFERENCE.fullmatch(expression.strip())
        if bare is not None:  # `params.regions`: the value itself, no conversion to CEL and back
            return parameters[bare.group(1)]
        return program.execute({"params": dict(parameters)})
    except KeyError as error:
        raise ConditionError(
            f"parameter {error.args[0]!r} has no value in this run (test it with "
            f"has(params.{error.args[0]}))",
            path=path,
        ) from None
    except Exception as error:  # the library's own errors (index, overload, overflow...)
        raise ConditionError(_first_line(error), path=path) from None


def evaluate(expression: str, parameters: Mapping[str, Any], *, path: str) -> bool:
    """The value of ``expression`` for a run's effective parameters; ConditionError when it
    fails or is not a boolean."""
    result = value_of(expression, parameters, path=path)
    if not isinstance(result, bool):
        raise ConditionError(
            f"must be a boolean, is {type(result).__name__} ({result!r})", path=path
        )
    return result


def unknown_parameters(expression: str, declared: set[str], *, path: str) -> DefinitionError | None:
    """The refusal of an expression that reads a parameter that is not declared, if it does."""
    unknown = sorted(referenced_parameters(expression) - declared)
    if not unknown:
        return None
    return DefinitionSchemaError(
        f"unknown parameter {', '.join(unknown)} (declared: "
        f"{', '.join(sorted(declared)) or 'none'})",
        path=path,
    )


def condition_errors(definition: DefinitionSpec) -> list[DefinitionError]:
    """Every ``when`` checked against the declarations (for a spec whose shape and
    parameter declarations are valid): bounds, syntax, names, then types on samples."""
    errors: list[DefinitionError] = []
    declared = {declaration.name for declaration in definition.parameters}
    samples: list[dict[str, Any]] | None = None
    for index, task in enumerate(definition.tasks):
        if task.when is None:
            continue
        path = f"spec.tasks[{index}].when"
        if task.compensate_for is not None:
            errors.append(
                DefinitionSchemaError(
                    "a compensation task runs when its task succeeded; it takes no condition",
                    path=path,
                )
            )
            continue
        if not declared:
            errors.append(
                DefinitionSchemaError(
                    "a condition reads declared parameters: declare them in spec.parameters",
                    path=path,
                )
            )
            continue
        unknown = unknown_parameters(task.when, declared, path=path)
        if unknown is not None:
            errors.append(unknown)
            continue
        if samples is None:
            samples = sample_values(definition)
        try:
            for values in samples:
                evaluate(task.when, values, path=path)
        except ConditionError as error:
            errors.append(DefinitionSchemaError(error.message, path=path))
    return errors
