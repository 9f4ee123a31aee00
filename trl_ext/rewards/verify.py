"""Answer checking: math_verify with guards against pathological input, falling back to normalised exact match."""

from __future__ import annotations

import logging
import math
import re
import threading
from dataclasses import dataclass
from typing import Any

from .parsing import normalize_answer


__all__ = ["verify_answer"]

logger = logging.getLogger(__name__)

# Texts longer than this skip math_verify and are only compared by exact match. latex2sympy's parser is
# superlinear in some inputs (nesting, absolute-value bars), so this also bounds the parsing time (< 1 s).
MAX_VERIFY_CHARS = 500
_MAX_BRACKET_DEPTH = 8
_MAX_BARS = 6
# math_verify timeouts (seconds) used on the main thread; they only work there because they rely on SIGALRM.
_PARSING_TIMEOUT = 3
_VERIFY_TIMEOUT = 3

# Constructs that latex2sympy evaluates eagerly while parsing (binomials, determinants and other matrix
# operations, gcd/lcm via nsimplify, the gamma function) or that sympy evaluates expensively while comparing
# (sums, products, integrals, limits). Text containing them is only compared by exact match: with no working
# timeout off the main thread, a single `\binom{10^9}{5 \cdot 10^8}` would otherwise hang the caller.
_UNSAFE_TEXT_RE = re.compile(r"\\(?:det|gcd|lcm|operatorname|sum|prod|i*int|oint|lim|begin)|matrix")
# Binomials and the gamma function are evaluated while parsing, which is only cheap for small literal arguments:
# allowed once per text, without powers or factorials, and with at most this many digits in the whole text.
_BINOMIAL_RE = re.compile(r"\\(?:[dt]?binom|choose)")
_GAMMA_RE = re.compile(r"\\(?:Gamma|gamma\s*[({])")
_MAX_EAGER_DIGITS = {_BINOMIAL_RE: 8, _GAMMA_RE: 3}
_GROWTH_TEXT_RE = re.compile(r"[!^*]|\\exp")
# Scientific notation with a huge exponent ("1E999999999"): sympy turns it into an exact rational while parsing.
_HUGE_E_NOTATION_RE = re.compile(r"[0-9.]\s*[eE]\s*[+-]?\s*[0-9]{5}")

# Limits for the parsed sympy expressions (see `_measure`).
_MAX_NODES = 300
_MAX_DIGITS = 100_000  # bound on the size of any exact number sympy may have to build
_MAX_SYMBOLIC_POWER = 64  # largest exponent allowed on a base that is not a plain rational number
_MAX_TERMS = 2_000  # bound on the number of terms a full expansion (`expand`, `simplify`) may produce
_MAX_FUNCTION_DEPTH = 2  # functions nested deeper than this (tan(tan(tan(1)))) make `simplify` explode
# `simplify` (trigsimp) is exponential in trigonometric functions of sums: sin(a+b+c+d+f+g+h), a product of four
# sin(x+y+1)-like factors, or sin(x+y+1)**8 each take seconds to minutes. Allow a few such functions, with short
# arguments, raised to small powers only.
_MAX_TRIG_ARGUMENT_TERMS = 3
_MAX_COMPOUND_TRIG = 2
_MAX_COMPOUND_TRIG_POWER = 2
_LOG10_2 = math.log10(2)

_math_verify = None  # (parse, verify, Basic, MatrixBase, TimeoutException) once imported; False if unavailable


def _load_math_verify():
    global _math_verify
    if _math_verify is None:
        try:
            from math_verify import parse, verify
            from math_verify.errors import TimeoutException
            from sympy import Basic
            from sympy.matrices import MatrixBase

            _math_verify = (parse, verify, Basic, MatrixBase, TimeoutException)
        except Exception:  # pragma: no cover - math_verify is a dependency, but exact match still works without it
            logger.warning("math_verify could not be imported; answers are compared by exact match only")
            _math_verify = False
    return _math_verify


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


# Sympy functions (by class name, so undefined functions such as `\operatorname{prime}(x)` count too) whose value
# grows like a factorial or an exponential in their argument.
_GROWTH_FUNCTIONS = frozenset(
    {
        "factorial", "factorial2", "subfactorial", "binomial", "gamma", "loggamma", "RisingFactorial",
        "FallingFactorial", "exp", "sinh", "cosh", "tanh", "coth", "fibonacci", "lucas", "bell", "catalan",
        "bernoulli", "euler", "harmonic", "genocchi", "partition", "prime", "primepi", "primorial", "multinomial",
    }
)  # fmt: skip
_TRIG_FUNCTIONS = frozenset(
    {
        "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "acot", "asec", "acsc", "sinh", "cosh",
        "tanh", "coth", "sech", "csch", "asinh", "acosh", "atanh", "acoth",
    }
)  # fmt: skip
# Unevaluated algorithms (sums, integrals, ...) that sympy may run while comparing, for an unbounded time.
_FORBIDDEN_CLASSES = frozenset(
    {"Sum", "Product", "Integral", "Limit", "Derivative", "Subs", "Determinant", "MatPow", "Lambda"}
)


class _Unsafe(Exception):
    pass


@dataclass(frozen=True)
class _Size:
    """Upper bounds describing how expensive an expression is to evaluate, compare and simplify."""

    digits: float  # decimal digits of the exact numbers involved
    magnitude: float  # log10 |value|; symbols count as magnitude 10
    numeric: bool  # no free symbols
    rational: bool  # a rational number that sympy evaluates exactly (no symbols, functions, roots or constants)
    terms: float  # number of terms after full expansion
    compound_trig: bool = False  # contains a trigonometric function of a sum


def _integer_digits(value: int) -> float:
    return max(1.0, abs(value).bit_length() * _LOG10_2)


def _exponent_bound(log_magnitude: float) -> float:
    """Upper bound on |e| given an upper bound on log10|e|; raises once it exceeds any exponent we allow."""
    if log_magnitude > math.log10(_MAX_DIGITS):
        raise _Unsafe
    return max(1.0, 10.0**log_magnitude)


def _expansion_terms(terms: float, exponent: float) -> float:
    """Upper bound on the number of terms of (t_1 + ... + t_terms) ** exponent once expanded."""
    if terms <= 1:
        return 1.0
    k = math.ceil(exponent)
    log_count = (math.lgamma(terms + k) - math.lgamma(k + 1) - math.lgamma(terms)) / math.log(10)
    return math.inf if log_count > 9 else 10.0**log_count


def _measure(expr: Any, budget: list[int], function_depth: int = 0) -> _Size:
    """Bound the cost of evaluating `expr`, raising `_Unsafe` when it could exceed the module limits.

    `budget` holds the number of tree nodes still allowed to be visited and the number of trigonometric functions
    of sums still allowed.
    """
    from sympy import E, Add, Float, Function, Integer, Mul, Pow, Rational, Symbol
    from sympy.matrices import MatrixBase

    budget[0] -= 1
    if budget[0] < 0 or isinstance(expr, MatrixBase):
        raise _Unsafe
    name = type(expr).__name__
    if name in _FORBIDDEN_CLASSES or "Matrix" in name:
        raise _Unsafe
    if isinstance(expr, Integer):
        digits = _integer_digits(int(expr))
        return _Size(digits, digits, True, True, 1.0)
    if isinstance(expr, Rational):
        numerator, denominator = _integer_digits(int(expr.p)), _integer_digits(int(expr.q))
        return _Size(max(numerator, denominator), max(0.0, numerator - denominator + 1), True, True, 1.0)
    if isinstance(expr, Float):
        _sign, mantissa, exponent, bit_count = expr._mpf_
        if not mantissa:  # zero, or nan/inf (which sympy represents with an empty mantissa)
            return _Size(1.0, 0.0, True, True, 1.0)
        magnitude = (exponent + bit_count) * _LOG10_2
        return _Size(max(1.0, abs(magnitude), expr._prec * _LOG10_2), max(0.0, magnitude), True, True, 1.0)
    if isinstance(expr, Symbol):
        return _Size(1.0, 1.0, False, False, 1.0)
    args = getattr(expr, "args", ())
    if not isinstance(args, tuple):
        raise _Unsafe
    if not args:  # other atoms: pi, E, I, oo, sets such as Reals, ...
        return _Size(1.0, 1.0, not getattr(expr, "free_symbols", ()), False, 1.0)
    # E**x is how latex2sympy writes e^{x}: treat it as the function exp(x).
    is_exp = isinstance(expr, Pow) and expr.base is E
    is_function = isinstance(expr, Function) or is_exp
    if is_function:
        function_depth += 1
        if function_depth > _MAX_FUNCTION_DEPTH:
            raise _Unsafe
    parts = [_measure(arg, budget, function_depth) for arg in args]
    digits = sum(part.digits for part in parts)
    numeric = all(part.numeric for part in parts)
    rational = False
    largest = max(part.magnitude for part in parts)
    compound_trig = any(part.compound_trig for part in parts)
    if name in _TRIG_FUNCTIONS and parts[0].terms > 1:
        budget[1] -= 1
        if parts[0].terms > _MAX_TRIG_ARGUMENT_TERMS or budget[1] < 0:
            raise _Unsafe
        compound_trig = True
    if is_exp:
        magnitude = _exponent_bound(parts[1].magnitude) * 0.5
        digits += magnitude
        terms = 1.0
    elif isinstance(expr, Pow):
        base, exponent_size = parts
        exponent = _exponent_bound(exponent_size.magnitude)
        if not base.rational and exponent > _MAX_SYMBOLIC_POWER:
            raise _Unsafe
        if base.compound_trig and exponent > _MAX_COMPOUND_TRIG_POWER:
            raise _Unsafe
        rational = base.rational and isinstance(expr.exp, Integer)
        magnitude = max(base.digits, base.magnitude) * exponent
        digits += magnitude
        terms = _expansion_terms(base.terms, exponent) if exponent_size.numeric else base.terms
    elif isinstance(expr, Mul):
        magnitude = sum(part.magnitude for part in parts)
        rational = all(part.rational for part in parts)
        terms = math.prod(part.terms for part in parts)
    elif isinstance(expr, Add):
        magnitude = largest + 1.0
        rational = all(part.rational for part in parts)
        terms = sum(part.terms for part in parts)
    elif name in _GROWTH_FUNCTIONS:
        magnitude = _exponent_bound(largest) * (largest + 1.0)
        digits += magnitude
        terms = 1.0
    else:  # relations, sets, tuples, mild functions (sin, log, floor, Mod, ...)
        magnitude = largest
        terms = 1.0 if is_function else sum(part.terms for part in parts)
    if digits > _MAX_DIGITS or magnitude > _MAX_DIGITS or terms > _MAX_TERMS:
        raise _Unsafe
    return _Size(digits, magnitude, numeric, rational, terms, compound_trig)


def _expression_is_safe(expr: Any) -> bool:
    """Whether comparing `expr` is cheap enough for sympy: small tree, no huge numbers, no unevaluated algorithms."""
    try:
        _measure(expr, [_MAX_NODES, _MAX_COMPOUND_TRIG])
        return True
    except (_Unsafe, RecursionError):
        return False
    except Exception:
        return False


def _bracket_depth(text: str) -> int:
    """Deepest nesting of (), [] and {} in `text` (unbalanced closing brackets are ignored)."""
    depth = deepest = 0
    for char in text:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}" and depth:
            depth -= 1
    return deepest


def _text_is_safe(text: str) -> bool:
    """Whether `text` is short and free of constructs that make latex2sympy or sympy do unbounded work."""
    if not 0 < len(text) <= MAX_VERIFY_CHARS:
        return False
    if _UNSAFE_TEXT_RE.search(text) is not None or _HUGE_E_NOTATION_RE.search(text) is not None:
        return False
    if text.count("|") > _MAX_BARS or _bracket_depth(text) > _MAX_BRACKET_DEPTH:
        return False
    eager = [(pattern, len(pattern.findall(text))) for pattern in _MAX_EAGER_DIGITS]
    if not any(count for _pattern, count in eager):
        return True
    if sum(count for _pattern, count in eager) > 1 or _GROWTH_TEXT_RE.search(text) is not None:
        return False
    digits = sum(char.isdigit() for char in text)
    return all(digits <= _MAX_EAGER_DIGITS[pattern] for pattern, count in eager if count)


def _parse(text: str, timeout: int | None) -> list:
    r"""Parse an answer with math_verify, returning only the sympy objects that are safe to compare.

    A bare answer is wrapped in `$...$` so LaTeX extraction sees it as math ("\frac{1}{2}", "(1, 2)", "5\%");
    text that is already delimited, boxed, or written with Python's `**` is parsed as is. The other spelling is
    the fallback when the first yields no expression.
    """
    parse, _verify, Basic, MatrixBase, _TimeoutException = _math_verify
    wrapped = f"${text}$"
    as_is_first = "**" in text or "$" in text or "\\boxed" in text or "\\[" in text or "\\(" in text
    for candidate in (text, wrapped) if as_is_first else (wrapped, text):
        results = parse(candidate, parsing_timeout=timeout, raise_on_error=False)
        expressions = [item for item in results if isinstance(item, (Basic, MatrixBase))]
        if expressions:
            return [item for item in expressions if _expression_is_safe(item)]
    return []


def _math_verify_equal(gold: str, prediction: str) -> bool:
    if not _load_math_verify() or not (_text_is_safe(gold) and _text_is_safe(prediction)):
        return False
    _parse_fn, verify, _Basic, _MatrixBase, TimeoutException = _math_verify
    timeout = _PARSING_TIMEOUT if _on_main_thread() else None
    try:
        gold_parsed = _parse(gold, timeout)
        if not gold_parsed:
            return False
        prediction_parsed = _parse(prediction, timeout)
        if not prediction_parsed:
            return False
        return bool(
            verify(
                gold_parsed,
                prediction_parsed,
                timeout_seconds=_VERIFY_TIMEOUT if timeout is not None else None,
                raise_on_error=False,
            )
        )
    except (Exception, TimeoutException):
        # math_verify swallows most errors itself, but re-raises some (e.g. its signal-in-thread ValueError), and
        # its TimeoutException derives from BaseException.
        return False


def verify_answer(gold: Any, prediction: Any) -> bool:
    r"""Whether `prediction` is a correct answer for `gold`.

    Uses math_verify (so "0.5", "1/2" and "\frac{1}{2}" agree); when it fails, or the input is too long or uses
    constructs sympy could choke on, falls back to `normalize_answer(gold) == normalize_answer(prediction)`.
    Non-string arguments are converted with `str()` (`None` counts as empty). An empty side is never correct. Safe
    to call off the main thread (math_verify's SIGALRM timeouts are then disabled). Never raises.
    """
    try:
        gold = "" if gold is None else gold if isinstance(gold, str) else str(gold)
        prediction = "" if prediction is None else prediction if isinstance(prediction, str) else str(prediction)
        gold, prediction = gold.strip(), prediction.strip()
        if not gold or not prediction:
            return False
        if _math_verify_equal(gold, prediction):
            return True
        gold_normalized = normalize_answer(gold)
        return bool(gold_normalized) and gold_normalized == normalize_answer(prediction)
    except Exception:
        return False
