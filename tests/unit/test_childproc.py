"""omnitrace.childproc.module_of: the module a child's command line runs (``-m``), read past
the interpreter's own options. Children started from a decoy ``omnitrace`` folder
(issue 25, item 7): tests/system/cli/test_child_cwd.py."""
from __future__ import annotations


from omnitrace.childproc import module_of
def test_module_of_names_the_module():
    assert module_of(["python", "-m", "pkg.mod", "x"]) == "pkg.mod"
    assert module_of(["python", "-P", "-X", "dev", "-m", "pkg.mod"]) == "pkg.mod"
    assert module_of(["python", "script.py", "-m", "x"]) is None
    assert module_of(["python", "-c", "print(1)", "pkg"]) is None
    assert module_of(["vllm", "serve", "-m", "x"]) is None


def test_shell_status_reads_a_signal_death_as_128_plus_n():
    from omnitrace.childproc import shell_status
    assert shell_status(-15) == 143 and shell_status(0) == 0 and shell_status(3) == 3
