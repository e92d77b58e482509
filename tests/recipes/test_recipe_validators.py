"""The row checks a recipe declares (trainer_core/recipes/validators.py, sql_check.py, user_code.py): every kind passes
and fails a row with a one-line reason naming it and its column, every bad setting is a problem naming its field, SQL
only reads, and a Python validator that raises, returns nonsense, exits or hangs fails that row, never the job."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer_core.recipes import sql_check, user_code, validators
from trainer_core.recipes.validators import RowChecker, ValidatorSpec, needs_admin, parse_validators

SCHEMA = {"type": "object", "required": ["answer", "source"],
          "properties": {"answer": {"type": "string"}, "source": {"type": "string", "pattern": "^[a-z]+\\.pdf$"}}}
SCHEMA_SQL = ("CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT NOT NULL, age INT);"
              "INSERT INTO users(name, age) VALUES ('ada', 36), ('alan', 41);")


def checker(*entries: dict) -> RowChecker:
    specs, problems = parse_validators(list(entries))
    assert problems == []
    return RowChecker(specs)


def test_json_schema_checks_json_text_and_objects_and_names_what_is_wrong():
    check = checker({"type": "json_schema", "column": "out", "schema": SCHEMA}).check
    assert check({"out": json.dumps({"answer": "yes", "source": "guide.pdf"})}) is None
    assert check({"out": {"answer": "yes", "source": "guide.pdf"}}) is None
    assert check({"out": '{"answer": "yes"}'}) == "json_schema on out: 'source' is a required property"
    assert check({"out": {"answer": "yes", "source": "Guide.PDF"}}) == \
        "json_schema on out: 'Guide.PDF' does not match '^[a-z]+\\\\.pdf$' (at source)"
    assert check({"out": "yes, it is"}) == "json_schema on out: not valid JSON (Expecting value: line 1 column 1 " \
                                           "(char 0))"
    assert check({"out": "[" * 100_000 + "]" * 100_000}) == "json_schema on out: the value is nested too deeply or " \
                                                            "too large to check"


def test_regex_searches_or_matches_in_full_and_a_runaway_pattern_stops_at_the_limit(monkeypatch):
    search = checker({"type": "regex", "column": "sql", "pattern": "(?i)^select\\b"}).check
    assert search({"sql": "SELECT 1"}) is None
    assert search({"sql": "DROP TABLE x"}) == "regex on sql: does not match '(?i)^select\\\\b'"
    full = checker({"type": "regex", "column": "n", "pattern": "\\d+", "mode": "fullmatch", "name": "digits"}).check
    assert full({"n": "123"}) is None and full({"n": 123}) is None  # a number is checked as its JSON text
    assert full({"n": "123a"}) == "digits on n: does not match '\\\\d+' in full"
    monkeypatch.setattr(validators, "PATTERN_TIMEOUT_S", 0.05)  # the limit's size is not what this checks
    runaway = checker({"type": "regex", "column": "t", "pattern": "(a|aa)+b"}).check
    assert runaway({"t": "a" * 60}) == ("regex on t: the pattern took longer than 0.05 s on this value (60 "
                                        "characters): rewrite it so that each character can match in one way only")


def test_length_counts_characters_and_words():
    check = checker({"type": "length", "column": "a", "min_chars": 3, "max_chars": 40, "min_words": 2,
                     "max_words": 5}).check
    assert check({"a": "two words"}) is None
    assert check({"a": "ok"}) == "length on a: 2 characters: at least 3 (min_chars)"
    assert check({"a": "x" * 41}) == "length on a: 41 characters: at most 40 (max_chars)"
    assert check({"a": "single"}) == "length on a: 1 words: at least 2 (min_words)"
    assert check({"a": "a b c d e f"}) == "length on a: 6 words: at most 5 (max_words)"
    assert check({"a": None}) == "length on a: 0 characters: at least 3 (min_chars)"


def test_sql_must_run_against_the_schema_and_only_read():
    check = checker({"type": "sql", "column": "q", "schema_sql": SCHEMA_SQL}).check
    assert check({"q": "SELECT name FROM users WHERE age > 40;"}) is None
    assert check({"q": "WITH old AS (SELECT * FROM users WHERE age > 40) SELECT count(*) FROM old"}) is None
    assert check({"q": "SELECT nickname FROM users"}) == "sql on q: does not execute (no such column: nickname)"
    assert check({"q": "SELEC 1"}) == 'sql on q: does not execute (near "SELEC": syntax error)'
    assert check({"q": ""}) == "sql on q: not a query: give one SELECT (or WITH ... SELECT) statement"
    refused = "sql on q: only read queries (SELECT or WITH) may run: this one would "
    assert check({"q": "DROP TABLE users"}) == refused + "change the schema"
    assert check({"q": "INSERT INTO users(name) VALUES ('eve')"}) == refused + "insert into users"
    assert check({"q": "DELETE FROM users"}) == refused + "delete from users"
    assert check({"q": "ATTACH DATABASE 'stolen.db' AS s"}) == refused + "attach a database"
    assert check({"q": "VACUUM INTO 'copy.db'"}) == refused + "attach a database"
    assert check({"q": "PRAGMA table_info(users)"}) == refused + "run a PRAGMA"
    assert check({"q": "SELECT 1; DROP TABLE users"}) == \
        "sql on q: does not execute (You can only execute one statement at a time.)"
    # each row gets a fresh database: a refused write never reaches the next row's
    assert check({"q": "SELECT count(*) FROM users"}) is None


def test_a_query_that_runs_away_is_stopped_at_the_time_limit(monkeypatch):
    monkeypatch.setattr(sql_check, "SQL_TIME_LIMIT_S", 0.3)  # the schema (one CREATE) takes microseconds of it
    check = checker({"type": "sql", "column": "q", "schema_sql": "CREATE TABLE t(a);"}).check
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    assert check({"q": endless}) == "sql on q: took longer than 0.3 s and was stopped"


def test_nul_and_huge_values_give_reasons_not_errors():
    check = checker({"type": "regex", "column": "a", "pattern": "^ok"},
                    {"type": "sql", "column": "q", "schema_sql": "CREATE TABLE t(a);"},
                    {"type": "json_schema", "column": "j", "schema": {"type": "object"}},
                    {"type": "length", "column": "a", "max_chars": 100}).check
    assert check({"a": "ok\x00", "q": "SELECT 1", "j": "{}"}) is None
    assert check({"a": "ok", "q": "SELECT\x00 1", "j": "{}"}) == \
        "sql on q: does not execute (the query contains a null character)"
    assert check({"a": "ok", "q": "SELECT 1", "j": '{"a": "\\u0000"}'}) is None
    huge = "ok " + "word\n" * 2_000_000
    reason = check({"a": huge, "q": "SELECT 1", "j": "{}"})
    assert reason == "length on a: 10,000,003 characters: at most 100 (max_chars)"
    reason = check({"a": "ok", "q": "SELECT '" + "x" * 20_000_000 + "'", "j": "{}"})
    assert reason == "sql on q: does not execute (string or blob too big)"
    long_reason = checker({"type": "regex", "column": "a", "pattern": "y" * 1000}).check({"a": "x"})
    assert len(long_reason) == validators.REASON_CHARS and long_reason.endswith("…") and "\n" not in long_reason


def test_the_first_failure_is_the_reason_and_a_missing_column_is_named():
    check = checker({"type": "length", "column": "question", "min_chars": 1},
                    {"type": "regex", "column": "answer", "pattern": "\\[\\d+\\]", "name": "cites"}).check
    assert check({"question": "Why?", "answer": "Because [1]."}) is None
    assert check({"question": "", "answer": "no citation"}) == "length on question: 0 characters: at least 1 " \
                                                                "(min_chars)"
    assert check({"question": "Why?", "answer": "no citation"}) == "cites on answer: does not match '\\\\[\\\\d+\\\\]'"
    assert check({"question": "Why?"}) == "cites on answer: the row has no column 'answer' (its columns: question)"
    assert check(["not", "a", "row"]) == "the row is a list, not a mapping of columns"


def test_every_bad_setting_is_a_problem_naming_its_field(tmp_path):
    specs, problems = parse_validators([
        "length",
        {"type": "lenght", "column": "a"},
        {"type": "regex", "column": "a", "pattern": "(", "mode": "match", "name": "1x", "flags": "i"},
        {"type": "json_schema", "column": "", "schema": {"type": "strin"}},
        {"type": "json_schema", "column": "a", "schema": "{}"},
        {"type": "length", "column": "a"},
        {"type": "length", "column": "a", "min_chars": -1, "max_words": 2, "min_words": 5},
        {"type": "sql", "column": "a", "schema_sql": "CREAT TABLE t(a);"},
        {"type": "sql", "column": "a", "schema_sql": f"CREATE TABLE t(a); ATTACH '{tmp_path / 'x.db'}' AS x;"},
        {"type": "sql", "column": "a"},
        {"type": "regex", "column": "a"},
        {"type": "length", "column": "ok", "min_chars": 1},
    ])
    assert problems == [
        ("validators[0]", "must be a mapping such as {type: regex, column: answer, pattern: '\\d+'}"),
        ("validators[1].type", "unknown validator 'lenght': choose one of json_schema, regex, length, sql, python"),
        ("validators[2].name", "letters, digits and _ only, starting with a letter (it names the check in rejection "
                               "reasons)"),
        ("validators[2].flags", "'regex' has no setting 'flags': it takes column, pattern, mode and name"),
        ("validators[2].mode", "'match': choose search (the pattern anywhere in the value) or fullmatch (the whole "
                               "value)"),
        ("validators[2].pattern", "not a valid regex (missing ) at position 1)"),
        ("validators[3].column", "give the column to check (a column the recipe makes or its seed has)"),
        ("validators[3].schema", "not a valid JSON schema ('strin' is not valid under any of the given schemas)"),
        ("validators[4].schema", "give a JSON Schema as a mapping, e.g. {type: object, required: [answer]}"),
        ("validators[5]", "give at least one of min_chars, max_chars, min_words and max_words"),
        ("validators[6].min_chars", "must be a whole number, 0 or more"),
        ("validators[6].min_words", "5 is more than max_words (2)"),
        ("validators[7].schema_sql", 'does not execute (near "CREAT": syntax error): fix the SQL so that SQLite '
                                     "runs it"),
        ("validators[8].schema_sql", "does not execute (ATTACH, DETACH and VACUUM INTO are not allowed: the database "
                                     "is built in memory from this SQL alone): fix the SQL so that SQLite runs it"),
        ("validators[9].schema_sql", "give the SQL that builds the database (CREATE TABLE ...;), as text"),
        ("validators[10].pattern", "give a regular expression (text), e.g. '^SELECT '"),
    ]
    assert not (tmp_path / "x.db").exists()
    assert [spec.to_dict() for spec in specs] == [{"type": "length", "name": "length", "column": "ok", "min_chars": 1}]
    assert parse_validators({"type": "length"}) == ([], [("validators", "must be a list of validators, e.g. [{type: "
                                                                        "length, column: answer, min_chars: 1}]")])
    assert parse_validators(None) == ([], [])


def test_names_are_made_unique_and_specs_round_trip():
    entries = [{"type": "regex", "column": "a", "pattern": "x"}, {"type": "regex", "column": "b", "pattern": "y"},
               {"type": "length", "column": "a", "max_words": 9, "name": "short"}]
    specs, problems = parse_validators(entries)
    assert problems == [] and [spec.name for spec in specs] == ["regex", "regex_2", "short"]
    assert parse_validators([spec.to_dict() for spec in specs]) == (specs, [])


# ---------------------------------------------------------------------- Python validators
CODE = '''import os
import time

def cites(row):
    return None if "[" in row["answer"] else "no citation in the answer"

def strict(row):
    return row["answer"].endswith(".")

def raises(row):
    raise ValueError("cannot read " + row["answer"][:8])

def hangs(row):
    while row["answer"] == "hang":
        time.sleep(0.01)
    return True

def exits(row):
    os._exit(3)

def prints(row):
    print("chatty validator")
    return True

def odd(row):
    return 5
'''


@pytest.fixture
def code(home, tmp_path) -> Path:
    """A validator file under the allowed roots (``home`` allows all of tmp_path) and an empty run folder."""
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "mine.py").write_text(CODE, encoding="utf-8")
    (tmp_path / "run").mkdir()
    return tmp_path


def python_checker(folder: Path, *functions: str, timeout_s: float | None = None) -> RowChecker:
    entries = [{"type": "python", "file": str(folder / "checks" / "mine.py"), "function": f} for f in functions]
    specs, problems = parse_validators(entries)
    assert problems == []
    rows = user_code.snapshot(specs, folder / "run")
    assert [row["name"] for row in rows] == list(functions)
    return RowChecker(specs, folder / "run", timeout_s=timeout_s)


def test_python_validators_pass_and_fail_rows_and_their_faults_fail_only_that_row(code):
    with python_checker(code, "cites", "strict", "raises", "exits", "prints", "odd") as rows:
        assert rows.check({"answer": "no"}) == "cites: no citation in the answer"
        assert rows.check({"answer": "[1] yes"}) == "strict: returned False"
    with python_checker(code, "raises") as rows:
        assert rows.check({"answer": "a bad answer"}) == "raises: raised ValueError: cannot read a bad an"
    with python_checker(code, "exits", "prints") as rows:
        assert rows.check({"answer": "x"}) == ("exits: ended the validator process (exit code 3): a validator returns "
                                               "its result and never exits")
    with python_checker(code, "prints", "odd") as rows:  # its print goes to the log, not into the replies
        assert rows.check({"answer": "x"}) == ("odd: returned a value of type int: return True or None to pass, False "
                                               "or a reason (text) to fail")
    with python_checker(code, "cites") as rows:  # a huge row with NUL characters travels whole
        assert rows.check({"answer": "[1]\x00" + "y" * 5_000_000}) is None
        assert rows.check({"answer": "[1]", ("not", "text"): 1}) == ("cites: the row cannot be given to the validator "
                                                                     "as JSON (keys must be str, int, float, bool or "
                                                                     "None, not tuple)")


def test_a_python_validator_that_hangs_is_ended_and_the_next_row_gets_a_fresh_process(code):
    with python_checker(code, "hangs", "cites", timeout_s=2.0) as rows:
        assert rows.check({"answer": "hang"}) == ("hangs: took longer than 2 s on this row and was ended (raise "
                                                  "FINETUNE_STUDIO_VALIDATOR_TIMEOUT_S if it needs longer)")
        assert rows.check({"answer": "no"}) == "cites: no citation in the answer"
        assert rows.check({"answer": "[1]"}) is None


def test_python_validator_files_are_checked_copied_hashed_and_admin_only(code, tmp_path):
    mine = tmp_path / "checks" / "mine.py"
    (tmp_path / "checks" / "bad.py").write_text("def f(row:\n", encoding="utf-8")
    (tmp_path / "checks" / "async.py").write_text("async def f(row):\n    return True\n", encoding="utf-8")
    _, problems = parse_validators([
        {"type": "python", "file": str(mine), "function": "missing"},
        {"type": "python", "file": str(tmp_path / "checks" / "bad.py"), "function": "f"},
        {"type": "python", "file": str(tmp_path / "checks" / "async.py"), "function": "f"},
        {"type": "python", "file": "/etc/hostname", "function": "f", "column": "a"},
        {"type": "python", "file": "", "function": "f"},
        {"type": "python", "file": str(mine), "function": "not a name"},
    ])
    assert [field for field, _ in problems] == ["validators[0].function", "validators[1].file",
                                                "validators[2].function", "validators[3].column", "validators[3].file",
                                                "validators[4].file", "validators[5].function"]
    assert problems[0][1] == f"{mine}: the file defines no top-level function 'missing'"
    assert problems[1][1] == f"{tmp_path / 'checks' / 'bad.py'} does not parse: line 1: '(' was never closed"
    assert problems[2][1] == f"{tmp_path / 'checks' / 'async.py'}: f is async: a validator function must be a plain def"
    assert problems[4][1].endswith("a validator file must be under the allowed roots (FINETUNE_STUDIO_ALLOWED_ROOTS)")
    # the worker parses without reading the original (it runs the copy)
    specs, problems = parse_validators([{"type": "python", "file": "/gone/mine.py", "function": "f"}],
                                       check_files=False)
    assert problems == [] and needs_admin(specs) and not needs_admin([ValidatorSpec("regex", "regex", "a")])

    rows = python_checker(code, "cites")
    rows.close()
    manifest = json.loads((tmp_path / "run" / "validators" / "manifest.json").read_text())
    assert manifest == [{"name": "cites", "source": str(mine), "function": "cites",
                         "sha256": __import__("hashlib").sha256(CODE.encode()).hexdigest()}]
    (tmp_path / "run" / "validators" / "cites.py").write_text(CODE + "\n# edited\n", encoding="utf-8")
    specs, _ = parse_validators([{"type": "python", "file": str(mine), "function": "cites"}])
    with pytest.raises(RuntimeError, match="validators/cites.py is missing or was changed after the recipe was "
                                           "submitted"):
        RowChecker(specs, tmp_path / "run")
    with pytest.raises(ValueError, match="only the recipe's worker checks rows with them"):
        RowChecker(specs)


def test_a_validator_file_that_raises_when_loaded_stops_the_checker_naming_it(code, tmp_path):
    (tmp_path / "checks" / "mine.py").write_text("raise ImportError('no such package')\ndef f(row):\n    return True\n",
                                                 encoding="utf-8")
    with pytest.raises(RuntimeError) as caught:
        python_checker(code, "f")
    assert str(caught.value) == "validator f: loading its file raised ImportError: no such package"
