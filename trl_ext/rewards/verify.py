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

# Constructs that latex2sympy evaluates eagerly while parsing (determinants and other matrix operations, gcd/lcm
# via nsimplify) or that sympy evaluates expensively while comparing (sums, products, integrals, limits). Text
# containing them is only compared by exact match: there is no working timeout off the main thread, and even on
# it SIGALRM cannot interrupt one long big-integer operation.
_UNSAFE_TEXT_RE = re.compile(r"\\(?:det|gcd|lcm|operatorname|sum|prod|i*int|oint|lim|begin)|matrix")
# Binomials and the gamma function are evaluated while parsing (even with symbolic or transcendental arguments:
# \binom{90}{\sin(14)}), which is only cheap when the whole answer is one of them with small literal arguments.
_EAGER_RE = re.compile(r"\\(?:[dt]?binom|choose|(?:Gamma|gamma)\s*[({])")
_EAGER_LITERAL_RE = re.compile(
    r"\s*(?:\\[dt]?binom\s*\{\s*[0-9]{1,4}\s*\}\s*\{\s*[0-9]{1,4}\s*\}|\{?\s*[0-9]{1,4}\s*\\choose\s*[0-9]{1,4}\s*\}?"
    r"|\\Gamma\s*(?:\(\s*[0-9]{1,3}\s*\)|\{\s*[0-9]{1,3}\s*\}))\s*"
)
# Scientific notation with a huge exponent ("1E999999999"): sympy turns it into an exact rational while parsing.
_HUGE_E_NOTATION_RE = re.compile(r"[0-9.]\s*[eE]\s*[+-]?\s*[0-9]{5}")
# latex2sympy builds e^{...} with an evaluating `exp`, and compares interval ends while parsing; both evaluate
# numerically, so e^{\cos(99999!)}, e^{\sin(9^{9^{9}})} or (\exp(10^{11}), \lfloor 2 \rfloor) never finish. So
# factorials are of small numbers; exponents may not be numeric towers ("9^{9^{9}}", the inner base a number or a
# bracket), factorials, exponentials or long literal numbers ("10^{123456}"); and a text with an exponential has
# no factorial, no power of a number or bracket, and few digits.
_LARGE_NUMBER_RE = re.compile(r"[0-9]{4,}")
_MAX_FACTORIAL_OPERAND_RE = re.compile(r"[0-9]{4,}|[\^!]|\\exp")
_EXPONENTIAL_RE = re.compile(r"e\s*\^|\\exp")
_NUMERIC_POWER_RE = re.compile(r"[0-9)}\]]\s*\^")
_TOWER_EXPONENT_RE = re.compile(r"[0-9)}\]]\s*\^|!|\\exp|[0-9]{5}")
_MAX_EXPONENTIAL_DIGITS = 6

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
# trigsimp also applies double-angle formulas recursively: sin(128 x) or cos(2**36 / log(3)) explode, so integers
# inside a trigonometric argument (other than a rational multiple of pi) stay below about 150.
_MAX_TRIG_COEFFICIENT_MAGNITUDE = math.log10(150)
# `simplify` on an expression with log/exp/trig next to a large number (log(5 + e) - 1000000, 8/4465270 * log(18),
# pi + sin(428805682394039) - 4.6e11**63) builds e**1000000-like numbers or factors huge integers: pairs involving
# such functions may only contain numbers below 10**this, written with at most this many digits.
_MAX_TRANSCENDENTAL_PAIR_MAGNITUDE = 5.0
_LOG10_2 = math.log10(2)
_LOG10_E = math.log10(math.e)

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
_LOGARITHMIC_FUNCTIONS = frozenset({"log", "exp", "LambertW"})
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
    magnitude: float  # log10 |value|; a symbol counts as |value| <= 10
    numeric: bool  # no free symbols
    rational: bool  # a rational number that sympy evaluates exactly (no symbols, functions, roots or constants)
    terms: float  # number of terms after full expansion
    compound_trig: bool = False  # contains a trigonometric function of a sum
    transcendental: bool = False  # contains log, exp or a trigonometric function
    literal_digits: float = 1.0  # decimal digits of the longest number literal (numerator or denominator)


def _integer_digits(value: int) -> float:
    return max(1.0, abs(value).bit_length() * _LOG10_2)


def _exponent_bound(log_magnitude: float) -> float:
    """Upper bound on |e| given an upper bound on log10|e|; raises once it exceeds any exponent we allow."""
    if log_magnitude > math.log10(_MAX_DIGITS):
        raise _Unsafe
    return max(1.0, 10.0**log_magnitude)


def _value_bound(expr: Any, size: _Size) -> float:
    """Upper bound on |expr| (at least 1): exact for a plain number, else from its magnitude bound."""
    bound = _exponent_bound(size.magnitude)
    if getattr(expr, "is_Number", False):
        try:
            return max(1.0, abs(float(expr)))
        except (TypeError, ValueError, OverflowError):
            return bound
    return bound


def _expansion_terms(terms: float, exponent: float) -> float:
    """Upper bound on the number of terms of (t_1 + ... + t_terms) ** exponent once expanded."""
    if terms <= 1:
        return 1.0
    k = math.ceil(exponent)
    log_count = (math.lgamma(terms + k) - math.lgamma(k + 1) - math.lgamma(terms)) / math.log(10)
    return math.inf if log_count > 9 else 10.0**log_count


def _check_trig_coefficients(argument: Any) -> None:
    """Raise `_Unsafe` if a trigonometric argument holds a large number that trigsimp could halve many times.

    Plain numbers and rational multiples of pi are fine (sympy evaluates those directly); elsewhere every number
    in the argument, other than a denominator, must stay below about 150 in absolute value.
    """
    from sympy import Add, Mul, Pow, pi

    if getattr(argument, "is_Number", False) or getattr(argument / pi, "is_Rational", False):
        return
    pending = [argument]
    while pending:
        node = pending.pop()
        if isinstance(node, Pow) and node.exp.is_Number and node.exp.is_negative:
            if not node.base.is_Number:
                pending.append(node.base)
            continue  # a number as denominator: cos(x / 256) is harmless
        if isinstance(node, (Add, Mul)) or getattr(node, "free_symbols", None):
            pending.extend(getattr(node, "args", ()))
        elif _measure(node, [_MAX_NODES, _MAX_COMPOUND_TRIG]).magnitude > _MAX_TRIG_COEFFICIENT_MAGNITUDE:
            raise _Unsafe


def _measure(expr: Any, budget: list[int], function_depth: int = 0) -> _Size:
    """Bound the cost of evaluating `expr`, raising `_Unsafe` when it could exceed the module limits.

    `budget` holds the number of tree nodes still allowed to be visited and the number of trigonometric functions
    of sums still allowed.
    """
    from sympy import Add, E, Float, Function, Integer, Mul, Pow, Rational, Symbol
    from sympy.matrices import MatrixBase

    budget[0] -= 1
    if budget[0] < 0 or isinstance(expr, MatrixBase):
        raise _Unsafe
    name = type(expr).__name__
    if name in _FORBIDDEN_CLASSES or "Matrix" in name:
        raise _Unsafe
    if isinstance(expr, Integer):
        value = int(expr)
        digits = _integer_digits(value)
        return _Size(digits, abs(value).bit_length() * _LOG10_2, True, True, 1.0, literal_digits=digits)
    if isinstance(expr, Rational):
        numerator, denominator = _integer_digits(int(expr.p)), _integer_digits(int(expr.q))
        digits = max(numerator, denominator)
        return _Size(digits, max(0.0, numerator - denominator + 1), True, True, 1.0, literal_digits=digits)
    if isinstance(expr, Float):
        _sign, mantissa, exponent, bit_count = expr._mpf_
        if not mantissa:  # zero, or nan/inf (which sympy represents with an empty mantissa)
            return _Size(1.0, 0.0, True, True, 1.0)
        magnitude = (exponent + bit_count) * _LOG10_2
        digits = max(1.0, abs(magnitude))
        return _Size(
            max(digits, expr._prec * _LOG10_2), max(0.0, magnitude), True, True, 1.0, literal_digits=digits
        )
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
    transcendental = (
        is_exp
        or name in _LOGARITHMIC_FUNCTIONS
        or name in _TRIG_FUNCTIONS
        or any(part.transcendental for part in parts)
    )
    if name in _TRIG_FUNCTIONS:
        if parts[0].terms > 1:
            budget[1] -= 1
            if parts[0].terms > _MAX_TRIG_ARGUMENT_TERMS or budget[1] < 0:
                raise _Unsafe
            compound_trig = True
        _check_trig_coefficients(args[0])
    if is_exp:
        magnitude = _value_bound(args[1], parts[1]) * _LOG10_E
        digits += magnitude
        terms = 1.0
    elif isinstance(expr, Pow):
        base, exponent_size = parts
        exponent = _value_bound(args[1], exponent_size)
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
    elif name == "exp":
        magnitude = _value_bound(args[0], parts[0]) * _LOG10_E
        digits += magnitude
        terms = 1.0
    elif name in _GROWTH_FUNCTIONS:
        magnitude = max(_value_bound(arg, part) for arg, part in zip(args, parts)) * (largest + 1.0)
        digits += magnitude
        terms = 1.0
    else:  # relations, sets, tuples, mild functions (sin, log, floor, Mod, ...)
        magnitude = largest
        terms = 1.0 if is_function else sum(part.terms for part in parts)
    if digits > _MAX_DIGITS or magnitude > _MAX_DIGITS or terms > _MAX_TERMS:
        raise _Unsafe
    literal_digits = max(part.literal_digits for part in parts)
    return _Size(digits, magnitude, numeric, rational, terms, compound_trig, transcendental, literal_digits)


def _expression_size(expr: Any) -> _Size | None:
    """Cost bounds for comparing `expr`, or `None` if sympy could take unbounded time or memory on it."""
    try:
        return _measure(expr, [_MAX_NODES, _MAX_COMPOUND_TRIG])
    except (_Unsafe, RecursionError):
        return None
    except Exception:
        return None


def _pair_is_safe(gold: _Size, prediction: _Size) -> bool:
    """Whether comparing two individually safe expressions is safe too (see `_MAX_TRANSCENDENTAL_PAIR_MAGNITUDE`)."""
    if gold.transcendental or prediction.transcendental:
        # Magnitudes only count for numbers: symbols make them a loose bound, and symbolic terms stay symbolic.
        sizes = [size.literal_digits for size in (gold, prediction)]
        sizes += [size.magnitude for size in (gold, prediction) if size.numeric]
        return max(sizes) <= _MAX_TRANSCENDENTAL_PAIR_MAGNITUDE
    return True


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


def _exponents(text: str) -> list[str]:
    """The exponent of every `^` in `text`: a braced group, or the token right after the caret (with the character
    that follows it, so that "9^9^9" shows its tower)."""
    exponents = []
    for match in re.finditer(r"\^\s*", text):
        start = match.end()
        if text.startswith("{", start):
            depth = 0
            for index in range(start, len(text)):
                depth += {"{": 1, "}": -1}.get(text[index], 0)
                if depth == 0:
                    exponents.append(text[start + 1 : index])
                    break
            else:
                exponents.append(text[start + 1 :])
        else:
            token = re.match(r"\\[A-Za-z]+|[0-9]+|.?", text[start:])
            exponents.append(token.group(0) + text[start + len(token.group(0)) : start + len(token.group(0)) + 1])
    return exponents


def _factorials_are_small(text: str) -> bool:
    """Whether every factorial in `text` applies to a number below 1000, a letter, or a bracketed group without
    large numbers, powers, factorials or exponentials ("(n-1)!" is fine, "(483267)!" and "(10^{10})!" are not)."""
    for match in re.finditer(r"!", text):
        before = text[: match.start()].rstrip()
        if not before:
            continue
        if before[-1] == "!":  # a factorial of a factorial
            return False
        if before[-1] in ")}]":
            depth, start = 0, 0
            for index in range(len(before) - 1, -1, -1):
                depth += {")": 1, "}": 1, "]": 1, "(": -1, "{": -1, "[": -1}.get(before[index], 0)
                if depth == 0:
                    start = index
                    break
            if _MAX_FACTORIAL_OPERAND_RE.search(before[start:]) is not None:
                return False
        elif before[-1].isdigit():
            digits = re.search(r"[0-9.,\s]*$", before).group(0)
            if _LARGE_NUMBER_RE.search(re.sub(r"[.,\s]", "", digits)) is not None:
                return False
    return True


def _text_is_safe(text: str) -> bool:
    """Whether `text` is short and free of constructs that make latex2sympy or sympy do unbounded work."""
    if not 0 < len(text) <= MAX_VERIFY_CHARS:
        return False
    if _UNSAFE_TEXT_RE.search(text) is not None or _HUGE_E_NOTATION_RE.search(text) is not None:
        return False
    if text.count("|") > _MAX_BARS or _bracket_depth(text) > _MAX_BRACKET_DEPTH:
        return False
    if "!" in text and not _factorials_are_small(text):
        return False
    if _EXPONENTIAL_RE.search(text) is not None and (
        "!" in text
        or _NUMERIC_POWER_RE.search(text) is not None
        or sum(char.isdigit() for char in text) > _MAX_EXPONENTIAL_DIGITS
    ):
        return False
    if "^" in text and any(_TOWER_EXPONENT_RE.search(exponent) for exponent in _exponents(text)):
        return False
    return _EAGER_RE.search(text) is None or _EAGER_LITERAL_RE.fullmatch(text) is not None


def _parse(text: str, timeout: int | None) -> list[tuple[Any, _Size]]:
    r"""Parse an answer with math_verify, returning the sympy objects that are safe to compare, with their sizes.

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
            sized = [(item, _expression_size(item)) for item in expressions]
            return [(item, size) for item, size in sized if size is not None]
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
        verify_timeout = _VERIFY_TIMEOUT if timeout is not None else None
        for gold_expr, gold_size in gold_parsed:
            for prediction_expr, prediction_size in prediction_parsed:
                if _pair_is_safe(gold_size, prediction_size) and verify(
                    gold_expr, prediction_expr, timeout_seconds=verify_timeout, raise_on_error=False
                ):
                    return True
        return False
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
