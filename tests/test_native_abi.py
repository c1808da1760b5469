"""The native ABI is declared once (issue 39): sluice_abi.h in C, abi.py's
table in Python, held equal here.

- every prototype of the header has the table's return type and parameter
  types in the table's order (and names), and the table has no other entry;
- every struct of the header has the table's fields, in order, with its
  types; the ctypes classes have the compiler's sizes and offsets;
- the built library exports exactly the table's functions, and each is bound
  with the table's argtypes and restype;
- every .c file of the library includes the header;
- a table with two arguments swapped fails the comparison.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path

import pytest

from sluice.models import native
from sluice.models.native import abi, find_compiler
from sluice.models.native.build import _SOURCES

HEADER = Path(abi.__file__).with_name("sluice_abi.h")

requires_compiler = pytest.mark.skipif(find_compiler() is None, reason="no C compiler here")


def header_text() -> str:
    """The header without comments or preprocessor lines."""
    text = re.sub(r"/\*.*?\*/", " ", HEADER.read_text(), flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def header_structs(text: str) -> dict[str, abi.StructFields]:
    """`typedef struct { T name; ... } Name;` -> {Name: ((name, T), ...)}."""
    structs = {}
    for body, name in re.findall(r"typedef\s+struct\s*\{(.*?)\}\s*(\w+)\s*;", text, flags=re.S):
        fields = tuple(abi.parse_params(field)[0][::-1] for field in body.split(";")[:-1])
        structs[name] = fields
    return structs


def header_functions(text: str) -> dict[str, tuple[str, tuple[tuple[str, str], ...]]]:
    """Prototypes -> {name: (return type, ((type, name), ...))}."""
    text = re.sub(r"typedef\s+struct\s*\{.*?\}\s*\w+\s*;", " ", text, flags=re.S)
    functions = {}
    for statement in text.split(";")[:-1]:
        found = re.fullmatch(r"\s*(\w+)\s+(\w+)\s*\((.*)\)\s*", statement, flags=re.S)
        assert found is not None, f"not a prototype this parser reads: {statement.strip()!r}"
        returns, name, params = found.groups()
        assert name not in functions, f"{name} declared twice"
        functions[name] = (returns, abi.parse_params(params))
    return functions


def differences(
    functions: dict[str, abi.Function], structs: dict[str, abi.StructFields]
) -> list[str]:
    """Where a table (`functions`, `structs`) and the header disagree."""
    text = header_text()
    declared = header_functions(text)
    found = [f"{name}: in the header, not the table" for name in declared.keys() - functions]
    found += [f"{name}: in the table, not the header" for name in functions.keys() - declared]
    for name in declared.keys() & functions.keys():
        table = (functions[name].returns, abi.parse_params(functions[name].params))
        if table != declared[name]:
            found.append(f"{name}: header {declared[name]} != table {table}")
    header_struct_fields = header_structs(text)
    if header_struct_fields != structs:
        found.append(f"structs: header {header_struct_fields} != table {structs}")
    return found


def test_the_table_is_the_header():
    assert len(header_functions(header_text())) == len(abi.FUNCTIONS) >= 28
    assert set(header_structs(header_text())) == {
        "Int8Matrix",
        "QBlockPart",
        "LayerMatrix",
        "QBlockExpert",
        "DecoderLayer",
    }
    assert differences(abi.FUNCTIONS, abi.STRUCTS) == []


def swapped(params: str, i: int, j: int) -> str:
    parts = params.split(", ")
    parts[i], parts[j] = parts[j], parts[i]
    return ", ".join(parts)


@pytest.mark.parametrize(
    ("name", "i", "j"),
    [("int8_gemm_bf16", 5, 6), ("rope_write_kv_bf16", 9, 10), ("decode_attention_f32", 11, 12)],
)
def test_two_swapped_arguments_in_the_table_are_found(name, i, j):
    # Two pointers of different types (compensation, col_scales: both
    # c_void_p to ctypes), an int64_t and a pointer, an int64_t and a float:
    # each silent corruption through ctypes, each caught here.
    function = abi.FUNCTIONS[name]
    bad = {**abi.FUNCTIONS, name: abi.Function(function.returns, swapped(function.params, i, j))}
    found = differences(bad, abi.STRUCTS)
    assert len(found) == 1 and found[0].startswith(f"{name}: header"), found


def test_a_struct_field_out_of_order_in_the_table_is_found():
    fields = list(abi.STRUCTS["DecoderLayer"])
    fields[11], fields[13] = fields[13], fields[11]  # eps and decode_amx
    found = differences(abi.FUNCTIONS, {**abi.STRUCTS, "DecoderLayer": tuple(fields)})
    assert len(found) == 1 and found[0].startswith("structs:"), found


def test_ctypes_types_follow_the_c_types():
    decoder = abi.FUNCTIONS["decoder_layer_rows_bf16"].argtypes()
    assert decoder[0] is ctypes.POINTER(abi.DecoderLayer)
    assert decoder[1:3] == [ctypes.c_void_p, ctypes.c_int64]
    assert abi.FUNCTIONS["int8_packed_bytes"].restype() is ctypes.c_int64
    assert abi.FUNCTIONS["rms_norm_f32"].restype() is None
    assert abi.FUNCTIONS["int8_gemm_available"].argtypes() == []
    assert dict(abi.DecoderLayer._fields_)["qkv"] is abi.LayerMatrix
    assert dict(abi.LayerMatrix._fields_)["parts"] is ctypes.POINTER(abi.QBlockPart)


# Prints each struct's size and each field's offset, as the compiler lays them out.
_LAYOUT = """#include <stddef.h>
#include <stdio.h>
#include "sluice_abi.h"
int main(void) {
%s
    return 0;
}
"""


@requires_compiler
def test_the_struct_classes_have_the_compilers_layout(tmp_path):
    lines, want = [], []
    for name in abi.STRUCTS:
        structure = getattr(abi, name)
        lines.append(f'    printf("%zu\\n", sizeof({name}));')
        want.append(ctypes.sizeof(structure))
        for field, _ in abi.STRUCTS[name]:
            lines.append(f'    printf("%zu\\n", offsetof({name}, {field}));')
            want.append(getattr(structure, field).offset)
    source = tmp_path / "layout.c"
    source.write_text(_LAYOUT % "\n".join(lines))
    program = tmp_path / "layout"
    compiler = find_compiler()
    assert compiler is not None
    subprocess.run([compiler, f"-I{HEADER.parent}", "-o", str(program), str(source)], check=True)
    printed = subprocess.run([str(program)], check=True, capture_output=True, text=True).stdout
    assert [int(line) for line in printed.split()] == want


def test_every_source_includes_the_header():
    for source in _SOURCES:
        assert '#include "sluice_abi.h"' in source.read_text(), source.name


@requires_compiler
def test_the_library_exports_exactly_the_table_each_bound_as_declared():
    library = native._library()
    assert library is not None, native.native_status().describe()
    listed = subprocess.run(
        ["nm", "-D", "--defined-only", library._name], check=True, capture_output=True, text=True
    ).stdout
    exported = {line.split()[-1] for line in listed.splitlines() if line.split()[1] == "T"}
    assert exported == set(abi.FUNCTIONS), (
        "declare every exported function once, in sluice_abi.h and abi.FUNCTIONS: "
        f"{exported ^ set(abi.FUNCTIONS)}"
    )
    for name, function in abi.FUNCTIONS.items():
        bound = getattr(library, name)
        assert (
            list(bound.argtypes) == function.argtypes() and bound.restype == function.restype()
        ), name
