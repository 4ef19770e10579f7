#!/usr/bin/env python3
"""An agent loop: a "model" proposes shell commands one at a time, each runs in a sandbox, and
its output goes back to the model until the model gives a final answer.

The model here is a scripted stand-in (no network, no weights) so the example is deterministic;
swap ScriptedModel.next_action for a call to a real model and the loop stays the same.

Config comes from the environment like the SDK: AIRLOCK_URL, AIRLOCK_API_KEY (or the admin.key
file). Exits 0 when the final answer is right, 1 otherwise.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import List, Optional, Tuple

try:
    from airlock import Sandbox
except ImportError:  # run from a checkout without installing the SDK
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk",
                                    "python"))
    from airlock import Sandbox


@dataclass
class Action:
    command: Optional[str] = None  # a shell command to run, or
    answer: Optional[str] = None  # the final answer


class ScriptedModel:
    """Answers "how many prime numbers are there below 1000?" by exploring, writing a script,
    running it, and reading its output, the way a model with a shell tool would."""

    task = "How many prime numbers are there below 1000? Use the sandbox to find out."

    def next_action(self, history: List[Tuple[str, str, int]]) -> Action:
        step = len(history)
        if step == 0:
            return Action(command="uname -s && python3 --version")
        if step == 1:
            return Action(command=(
                "cat > primes.py <<'PY'\n"
                "import sys\n"
                "n = int(sys.argv[1])\n"
                "sieve = [True] * n\n"
                "sieve[0:2] = [False, False]\n"
                "for i in range(2, int(n ** 0.5) + 1):\n"
                "    if sieve[i]:\n"
                "        sieve[i * i::i] = [False] * len(sieve[i * i::i])\n"
                "print(sum(sieve))\n"
                "PY\n"
                "ls -l primes.py"))
        if step == 2:
            return Action(command="python3 primes.py 1000")
        if step == 3:
            _, output, code = history[-1]
            if code != 0:
                return Action(answer="I could not compute it.")
            # Cross-check with a different method before answering.
            return Action(command="seq 2 999 | factor | awk 'NF == 2' | wc -l")
        first, second = history[2][1].strip(), history[3][1].strip()
        if first == second:
            return Action(answer=f"There are {first} prime numbers below 1000.")
        return Action(answer=f"The two methods disagree ({first} vs {second}).")


def main() -> int:
    model = ScriptedModel()
    history: List[Tuple[str, str, int]] = []
    print(f"task: {model.task}\n")
    with Sandbox.create(template="base", ttl_seconds=600,
                        metadata={"example": "agent_loop"}) as sbx:
        print(f"sandbox {sbx.id}\n")
        for turn in range(1, 11):
            action = model.next_action(history)
            if action.answer is not None:
                print(f"[{turn}] model: FINAL ANSWER: {action.answer}")
                break
            assert action.command is not None
            print(f"[{turn}] model: $ {action.command}")
            result = sbx.exec(action.command, timeout_seconds=30)
            observation = result.stdout + result.stderr
            history.append((action.command, observation, result.exit_code or 0))
            for line in observation.rstrip("\n").splitlines():
                print(f"      | {line}")
            print(f"      exit code {result.exit_code}")
        else:
            print("the model gave no answer within 10 turns")
            return 1
    ok = action.answer == "There are 168 prime numbers below 1000."
    print("\nresult:", "OK" if ok else "UNEXPECTED ANSWER")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
