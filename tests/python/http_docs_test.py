#!/usr/bin/python3
"""The curl commands of docs/api.md's HTTP/JSON section, run as written
against a knnd serving what the section says it serves (a 4-dimensional
index built with payloads, HTTP on): each command's status is the one its
comment announces, its answer is JSON, and the error answer the section
shows is the one knnd gives.

  http_docs_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl --source-dir .
"""
import json
import os
import re
import subprocess
import tempfile
import unittest

import numpy as np

from knnd_harness import Daemon, free_port, generate_stubs, unittest_main

ARGS = None


def doc_section(source_dir):
    with open(os.path.join(source_dir, "docs", "api.md"), encoding="utf-8") as f:
        text = f.read()
    return text[text.index("\n## HTTP/JSON\n"):]


def curl_commands(section):
    """(expected status, command) for each curl command of the section's
    first sh block, continuation lines joined."""
    block = section[section.index("```sh\n") + 6:]
    block = block[:block.index("```")]
    commands, expected, current = [], None, ""
    for line in block.splitlines():
        m = re.match(r"# (\d{3}): ", line)
        if m:
            expected = int(m.group(1))
            continue
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            commands.append((expected, current.strip()))
            current = ""
    return commands


class CurlExamplesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        generate_stubs(ARGS.source_dir, os.path.join(cls.tmp.name, "stubs"))
        rng = np.random.default_rng(8)
        base = os.path.join(cls.tmp.name, "base.npy")
        np.save(base, rng.random((500, 4), dtype=np.float32))
        payloads = os.path.join(cls.tmp.name, "payloads.jsonl")
        with open(payloads, "w") as f:
            for r in range(500):
                f.write(json.dumps({"text": f"row {r}", "page": r}) + "\n")
        index = os.path.join(cls.tmp.name, "docs.index")
        subprocess.run([ARGS.knnctl, "build", "--input", base, "--output", index,
                        "--nlist", "8", "--payloads", payloads],
                       check=True, capture_output=True)
        cls.http = f"127.0.0.1:{free_port()}"
        cls.daemon = Daemon(ARGS.knnd, ["--index", index, "--workers", "1",
                                        "--http_listen", cls.http],
                            log_path=os.path.join(cls.tmp.name, "knnd.log"))
        if not cls.daemon.wait_serving(120):
            cls.daemon.stop()
            raise RuntimeError("knnd did not start: " + cls.daemon.read_log())

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.tmp.cleanup()

    def run_curl(self, command):
        """The command as the doc writes it, against this knnd: (status,
        answer parsed)."""
        command = command.replace("localhost:8080", self.http)
        r = subprocess.run(["bash", "-c", command + " -w '\\n%{http_code}'"],
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, KNND_TOKEN="any-token-0123456789"))
        self.assertEqual(r.returncode, 0, f"{command}: {r.stderr}")
        body, _, status = r.stdout.rpartition("\n")
        return int(status), json.loads(body)

    def test_every_curl_command_answers_as_its_comment_says(self):
        section = doc_section(ARGS.source_dir)
        commands = curl_commands(section)
        self.assertGreaterEqual(len(commands), 5)
        answers = []
        for expected, command in commands:
            self.assertTrue(command.startswith("curl "), command)
            status, answer = self.run_curl(command)
            self.assertEqual(status, expected, f"{command}: {answer}")
            if status != 200:
                self.assertIn("code", answer)
                self.assertIn("message", answer)
            elif "/v1/search" in command:
                self.assertEqual(len(answer["ids"]), answer["num_queries"] * answer["k"])
                if "payloads" in command:
                    self.assertEqual(answer["payloads"][0]["text"],
                                     "row " + answer["ids"][0])
            elif "/v1/get" in command:
                self.assertEqual([r["id"] for r in answer["records"]],
                                 ["153", "468"])
                self.assertEqual([r["payload"]["text"] for r in answer["records"]],
                                 ["row 153", "row 468"])
                self.assertEqual(answer["missing"], ["5000000"])
            if "allowed_ids" in command:
                self.assertTrue(set(answer["ids"]) <= {"17", "42", "99", "-1"})
            answers.append(answer)
        # The answers the section shows: the search's has every field knnd
        # writes (its values depend on the build's training), the error's
        # is knnd's word for word.
        shown = [json.loads(block.split("```")[0])
                 for block in section.split("```json\n")[1:]]
        self.assertEqual(len(shown), 2)
        self.assertEqual(set(shown[0]), set(answers[2]))
        self.assertEqual(shown[1], answers[-1])


if __name__ == "__main__":
    unittest_main(__doc__, knnctl=True)
