"""A selection in plain words, for someone who has not read the code (``kreg explain``,
``kreg build`` and the demo print these first; the detail stays in ``Selection.decided_by`` and
the trace)."""

from __future__ import annotations


def spec_choice_in_words(decided_by: str, target: str) -> str:
    """How the ranker chose a spec (``Selection.decided_by``, kreg/dispatch/ranker.py), as a
    sentence for someone who has not read the code; the detail stays in ``decided_by``."""
    import re

    if decided_by.startswith("tuning table entry"):
        return "Its spec is the tuning table's entry for this shape class, chosen from GPU timings."
    if decided_by.startswith("cost model"):
        where = re.search(r"; ([^;]+?), (\d{4}-\d\d-\d\d), triton", decided_by)
        ms = re.search(r"predicted ([\d.e+-]+) ms, lowest of (\d+) modelled", decided_by)
        return (f"A cost model fitted to GPU timings{f' ({where[1]}, {where[2]})' if where else ''}"
                f" predicts its spec to be the fastest"
                f"{f' of the {ms[2]} it models ({ms[1]} ms)' if ms else ''}.")  # fmt: skip
    if decided_by.startswith("heuristic cost"):
        n = re.search(r"lowest of (\d+) valid", decided_by)
        valid = f" of the {n[1]} valid ones" if n else ""
        return (f"No tuning entry or cost model covers this case on {target}, so a rough estimate "
                f"(not a timing) ranks its spec the cheapest{valid}.")  # fmt: skip
    if decided_by.startswith("priority"):
        return "Its spec is the first valid one: the family ranks its specs by no cost."
    return f"Its spec was chosen by: {decided_by}."


def summary(sel, algorithm: str = "auto") -> str:
    """The selection in plain words: which candidate, why its spec, why not the others."""
    chosen = sel.candidate.name
    pinned = " (as --algorithm asked)" if algorithm != "auto" else ""
    text = (f"{chosen} serves this problem on {sel.target.name}{pinned}. "
            f"{spec_choice_in_words(sel.decided_by, sel.target.name)}")  # fmt: skip
    others = {e.candidate: "" for e in sel.trace if e.candidate != chosen}  # in trace order
    for e in sel.trace:
        if e.candidate == chosen or e.ok:
            continue
        if e.stage != "ranked":
            others[e.candidate] = f"{e.candidate} cannot serve it (--verbose says why)"
        elif e.reason.startswith("opt-in"):
            others[e.candidate] = f"{e.candidate} is opt-in (--allow-opt-in lets it compete)"
        elif "estimated cost" in e.reason:
            others[e.candidate] = f"{e.candidate} could serve it too, at a higher estimated cost"
        elif "by name" in e.reason:
            others[e.candidate] = f"{e.candidate} ties with it and comes later by name"
        else:
            others[e.candidate] = f"{e.candidate} could serve it too, at a lower priority"
    said = [why for why in others.values() if why]
    return text + (" " + "; ".join(said) + "." if said else "")
