#!/usr/bin/env python3
"""Tests of tools/check_house.py on small trees made here: each rule finds its breach, and a
tree that keeps the rules passes."""
from __future__ import annotations

import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_house  # noqa: E402


def tree(files: dict[str, str]) -> Path:
    root = Path(tempfile.mkdtemp(prefix="check_house_"))
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


class CheckHouseTest(unittest.TestCase):
    def test_clean_tree_passes(self):
        root = tree({"src/api/a.cc": '#include "service/x.h"\n',
                     "src/service/s.cc": "int x = 1;\n",
                     "src/cli/c.cc": '#include "archive/tar.h"\n'})
        self.assertEqual(check_house.problems(root), [])

    def test_long_file_is_named_and_tests_are_exempt(self):
        root = tree({"src/service/big.cc": "x\n" * 801,
                     "src/service/big_test.cc": "x\n" * 2000,
                     "src/service/ok.cc": "x\n" * 800})
        found = check_house.problems(root)
        self.assertEqual(len(found), 1, found)
        self.assertIn("src/service/big.cc: 801 lines", found[0])

    def test_each_layer_rule(self):
        root = tree({"src/api/a.cc": '#include "protocol/protocol.h"\n',
                     "src/service/r.cc": 'auto p = "/v1/sandboxes";\n',
                     "src/service/h.h": "#include <boost/beast/http.hpp>\n",
                     "src/cli/c.cc": '#include "agent/tar.h"\n',
                     "src/agent/g.cc": '#include "service/agent_client.h"\n'})
        found = "\n".join(check_house.problems(root))
        for where in ("src/api/a.cc:1", "src/service/r.cc:1", "src/service/h.h:1",
                      "src/cli/c.cc:1", "src/agent/g.cc:1"):
            self.assertIn(where, found)

    def test_throwing_file_reads_are_named_in_every_folder(self):
        read = "std::string((std::istreambuf_iterator<char>(f)), {});\n"
        root = tree({"src/runtime/fake/f.cc": read, "src/agent/u.cc": read,
                     "src/common/files.h": "// not through istreambuf_iterator\n",
                     "src/agent/u_test.cc": read})
        found = "\n".join(check_house.problems(root))
        self.assertIn("src/runtime/fake/f.cc:1", found)
        self.assertIn("src/agent/u.cc:1", found)
        self.assertNotIn("src/common/files.h", found)
        self.assertNotIn("u_test.cc", found)

    def test_descriptors_made_without_close_on_exec_are_named(self):
        bad = {
            "src/a/open.cc": "int f = ::open(p, O_RDONLY);\n",
            "src/a/dup.cc": "UniqueFd c(::dup(fd));\n",
            "src/a/dup_cloexec_word.cc": "int c = ::dup(fd);  // O_CLOEXEC is not asked here\nint d = dup(fd) + O_CLOEXEC;\n",
            "src/a/pipe.cc": "if (pipe(p) != 0) {}\n",
            "src/a/fopen.cc": 'FILE* f = std::fopen(path, "wbx");\n',
            "src/a/stream.cc": "std::ifstream in(path);\n",
            "src/a/curl.cc": "CURL* c = curl_easy_init();\n",
            "src/a/mnl.cc": "auto* nl = mnl_socket_open(NETLINK_ROUTE);\n",
            "src/a/socket.cc": "int s = socket(AF_INET,\n    SOCK_STREAM, 0);\n",
        }
        good = {
            "src/b/open.cc": "int f = ::open(p,\n    O_RDONLY | O_CLOEXEC);\n",
            "src/b/dup.cc": "int c = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);\n",
            "src/b/pipe.cc": "if (::pipe2(p, O_CLOEXEC) != 0) {}\n",
            "src/b/fopen.cc": 'FILE* f = std::fopen(path, "wbxe");\n',
            "src/b/mnl.cc": "auto* nl = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);\n",
            "src/b/decl.cc": "tcp::socket socket(ex);\nstd::string accept(it->value());\n"
                             "auto& s = conn.socket();\nsize_t open() const;\nint n = socket_.open();\n",
            "src/b/text.cc": '// socket(AF_NETLINK, ...) filters\nauto m = "open(/dev/null)";\n'
                             "/* ::dup(fd) */ int x = 0;\n",
            "src/b/inheritable.cc": "// inheritable: it becomes fd 4 of the VMM\nint t = ::open(p, O_RDWR);\n",
            "src/common/curl_init.h": "CURL* c = curl_easy_init();\n",
            "src/b/x_test.cc": "std::ofstream out(path);\nint f = ::open(p, O_RDONLY);\n",
        }
        found = "\n".join(check_house.problems(tree({**bad, **good})))
        for path in bad:
            self.assertIn(path + ":1", found)
        self.assertIn("src/a/dup_cloexec_word.cc:2", found)  # CLOEXEC beside a dup is no excuse
        for path in good:
            self.assertNotIn(path, found)
        self.assertIn("close-on-exec", found)


if __name__ == "__main__":
    unittest.main()
