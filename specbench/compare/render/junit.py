"""A comparison as JUnit XML, for CI systems that show test reports.

Boundary: `Comparison` in, text out.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from specbench.compare.render.cells import (ci_title, format_change, format_ci, format_threshold, format_value,
                                            format_verdict)
from specbench.compare.result import Comparison


def to_junit(c: Comparison) -> str:
    """JUnit XML: one test case per (configuration, metric); a gated regression is a failure,
    a metric that could not be computed is skipped, runs that are not comparable are one
    errored test case."""
    suites = ET.Element("testsuites", name="specbench compare")
    suite = ET.SubElement(suites, "testsuite", name="specbench.compare")
    failures = errors = skipped = 0
    if not c.comparable:
        case = ET.SubElement(suite, "testcase", classname="specbench.compare", name="comparable")
        err = ET.SubElement(case, "error", message=c.summary(), type="NotComparable")
        err.text = "\n".join(c.reasons)
        errors += 1
    for r in c.results:
        case = ET.SubElement(suite, "testcase", classname=f"specbench.compare.{r.config}",
                             name=r.metric)
        detail = (f"{r.metric} on {r.config}: baseline {format_value(r.metric, r.baseline, r.n)}, "
                  f"current {format_value(r.metric, r.current, r.n)}, change {format_change(r)}, "
                  f"{ci_title(c)} {format_ci(r)}, allowed {format_threshold(r)}, "
                  f"verdict {format_verdict(r)}, n {r.n}" + (f" ({r.note})" if r.note else ""))
        if r.failed:
            fail = ET.SubElement(case, "failure", message=detail, type="Regression")
            fail.text = detail
            failures += 1
        elif r.verdict == "n/a":
            ET.SubElement(case, "skipped", message=detail)
            skipped += 1
        ET.SubElement(case, "system-out").text = detail
    n = len(suite.findall("testcase"))
    for el in (suites, suite):
        el.set("tests", str(n))
        el.set("failures", str(failures))
        el.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
