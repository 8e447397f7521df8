"""The statement CSV holds no spreadsheet formulas, whatever a user names a kernel."""

from __future__ import annotations

from gpulab.billing_service.csv_export import safe_cell


def test_cells_that_could_be_formulas_become_text() -> None:
    for evil in (
        '=HYPERLINK("http://x","y")',
        "+1+1",
        "-1+cmd|' /C calc'!A0",
        "@SUM(A1)",
        "\t=1",
        "\r=1",
    ):
        assert safe_cell(evil) == "'" + evil
    # Numbers stay numbers, negative ones too; ordinary text is untouched.
    for fine in ("-0.35", "12.5", "-3", "1e-06", "python3", "k-1", "", None):
        assert safe_cell(fine) == ("" if fine is None else fine)
