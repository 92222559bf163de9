"""Count the asserts in tests/ that compare a literal sentence: a string literal (or an
f-string's literal parts) of three or more words (space-separated tokens with two letters
together), anywhere in a side of `in`/`not in` (kind "in") or `==`/`!=` (kind "==", a list of
lines included), or the argument of .startswith/.endswith (kind "ends"). Each assert counts
once, under the first kind found. Goldens, rendered tables and README quotes count too: the
number is an upper bound on the sentence checks left to convert (issue 34).

    python3 tests/sentence_asserts.py [--lower] [tests] [FILE.py ...]   # per file, the total
"""
import ast
import re
import sys
from collections import Counter
from pathlib import Path

# A word: a space-separated token with two letters together; --lower: a lowercase word only
# (a sentence's, not a GPU's name such as "NVIDIA GeForce RTX 5090").
WORD = re.compile(r"^[a-z][a-z'-]+[,.;:)]?$" if "--lower" in sys.argv else r"[A-Za-z]{2}")


def literal_text(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return " ".join(v.value for v in node.values if isinstance(v, ast.Constant))
    return None


def has_sentence(node):
    for sub in ast.walk(node):
        text = literal_text(sub)
        if text is not None and sum(1 for w in text.split() if WORD.search(w)) >= 3:
            return True
    return False


def kind(test):
    for node in ast.walk(test):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            ops = {type(op) for op in node.ops}
            if ops & {ast.In, ast.NotIn} and any(has_sentence(s) for s in sides):
                return "in"
            if ops & {ast.Eq, ast.NotEq} and any(has_sentence(s) for s in sides):
                return "=="
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("startswith", "endswith")
                and any(has_sentence(a) for a in node.args)):
            return "ends"
    return None


def count(root):
    per = Counter()
    kinds = Counter()
    for path in sorted(Path(root).glob("**/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assert):
                k = kind(node.test)
                if k:
                    per[path.name] += 1
                    kinds[k] += 1
    return per, kinds


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--lower"]
    per, kinds = count(args[0] if args else "tests")
    only = args[1:]
    for name, n in per.most_common():
        if not only or name in only:
            print(f"{n:4d} {name}")
    print(f"{sum(per.values()):4d} asserts: " + ", ".join(f"{k} {n}" for k, n in kinds.items()))
