"""ctest_skips.py — for scripts/test.sh: the reason each skipped test gave (its first line of output),
which ctest prints only with -V. Arguments: Testing/Temporary/LastTest.log, the ctest console log."""
import re
import sys

last, console = sys.argv[1], sys.argv[2]
skipped = re.findall(r"Test +#\d+: (\S+) \.+\*+Skipped", open(console, errors="replace").read())
text = open(last, errors="replace").read() if skipped else ""
for name in skipped:
    m = re.search(r"\d+/\d+ Test: " + re.escape(name) + r"\n.*?Output:\n-+\n(.*?)<end of output>", text, re.S)
    lines = [x.strip() for x in (m.group(1) if m else "").splitlines() if x.strip()]
    why = next((x for x in lines if re.search(r"skip|no (cuda|gpu|nvidia)|missing|not (root|available)", x, re.I)),
               lines[0] if lines else "(it printed nothing)")
    print(f"    skipped {name}: {why[:200]}")
