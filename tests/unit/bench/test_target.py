"""The start-up check's pure parts: which time scale a run reports in, and what a model list says."""

from __future__ import annotations

import orjson
import pytest

from tailguard.bench.target import read_model_list, time_scale_for
from tailguard.errors import TargetError

URL = "http://h:1"


@pytest.mark.parametrize("given,reported,expected", [
    (None, None, 1.0),    # a real engine, nothing said: wall seconds
    (0.5, None, 0.5),     # said by hand against a server that does not list one
    (None, 1.0, 1.0),     # a simulator on real time
    (0.25, 0.25, 0.25),   # said and listed alike
    (1.0, 0.25, 1.0),     # wall seconds asked for on purpose
    (None, 0.25, 0.25),   # a simulator's own scale, taken at its word
])
def test_time_scale_for(given: float | None, reported: float | None, expected: float) -> None:
    assert time_scale_for(given, reported, URL) == expected


def test_a_time_scale_the_simulator_contradicts_is_refused() -> None:
    with pytest.raises(TargetError, match=r"--time-scale 0.1, but http://h:1 says its time scale is 0.25"):
        time_scale_for(0.1, 0.25, URL)


def test_the_model_list_gives_the_model_and_its_time_scale() -> None:
    body = orjson.dumps({"data": [{"id": "a", "time_scale": 0.1}, {"id": "b"}]})
    assert (read_model_list(URL, body, None).model, read_model_list(URL, body, None).time_scale) == ("a", 0.1)
    assert (read_model_list(URL, body, "b").model, read_model_list(URL, body, "b").time_scale) == ("b", None)
    assert read_model_list(URL, body, "unlisted").model == "unlisted"  # sent anyway: gateways route names they do not list
    with pytest.raises(TargetError, match="lists no model; pass --model NAME"):
        read_model_list(URL, b'{"data": []}', None)
    with pytest.raises(TargetError, match="is not an OpenAI model list"):
        read_model_list(URL, b"<html>hello</html>", None)
