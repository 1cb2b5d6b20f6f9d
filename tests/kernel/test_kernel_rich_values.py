"""Images in and rich values back, in a stock python3 ipykernel with ``%load_ext fleet_kernel``: an ``--in`` image
reaches the model as an image part; ``--out NAME:df|arr|fig|path`` bring back a DataFrame, an array, an image and a
file as data; a pickled array is refused."""

from __future__ import annotations

import pytest
from kernel_harness import PythonKernel
from scripted_lm import ScriptedLM, step


@pytest.mark.slow
def test_an_input_image_reaches_the_model_as_an_image(py: PythonKernel, scripted_lm: ScriptedLM) -> None:
    py.ok(
        "import numpy as np\nfrom PIL import Image\n"
        "photo = Image.new('RGB', (16, 9), (10, 200, 10))\narr = np.zeros((5, 7, 3), dtype=np.uint8)"
    )
    scripted_lm.add(
        "what do you see",
        [
            step("bytes", "print(type(photo).__name__, photo[:4] == b'\\x89PNG', type(arr).__name__)"),
            step("done", "SUBMIT(answer='green')"),
        ],
    )
    run = py.ok("%%fleet --in photo,arr --out seen\nwhat do you see")
    assert "bytes True bytes" in run.text()
    assert py.value("seen") == repr("green")
    roots = [i for i, body in enumerate(scripted_lm.requests) if scripted_lm.is_root(body)]
    first = [image for image in scripted_lm.images if image["request"] == roots[0]]
    assert [image["mime"] for image in first] == ["image/png", "image/png"] and all(i["bytes"] > 50 for i in first)


@pytest.mark.slow
def test_rich_values_come_back_as_data(py: PythonKernel, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add(
        "make a table",
        [
            step(
                "save",
                "import pandas as pd\n"
                "pd.DataFrame({'city': ['a', 'b'], 'n': [1, 41], 'x': [0.5, 2.0]}).to_parquet('/workspace/artifacts/t.parquet')",
            ),
            step("done", "SUBMIT(answer='saved')"),
        ],
    )
    run = py.ok("%%fleet --out t:df\nmake a table")
    assert "t.parquet" in str(scripted_lm.requests[0])  # the model was told where to save it
    py.ok(
        "import pandas as pd\n"
        "pd.testing.assert_frame_equal(t, pd.DataFrame({'city': ['a', 'b'], 'n': [1, 41], 'x': [0.5, 2.0]}))"
    )

    scripted_lm.add(
        "make an array",
        [
            step("save", "import numpy as np\nnp.save('/workspace/artifacts/m.npy', np.arange(12.0).reshape(3, 4))"),
            step("done", "SUBMIT(answer='saved')"),
        ],
    )
    py.ok("%%fleet --out m:arr\nmake an array")
    py.ok(
        "import numpy as np\nassert m.dtype == np.float64\nnp.testing.assert_array_equal(m, np.arange(12.0).reshape(3, 4))"
    )

    scripted_lm.add(
        "draw it",
        [
            step(
                "draw",
                "from PIL import Image\nImage.new('RGB', (30, 20), (0, 0, 255)).save('/workspace/artifacts/f.png')",
            ),
            step("done", "SUBMIT(answer='drawn')"),
        ],
    )
    run = py.ok("%%fleet --out f:fig\ndraw it")
    assert any("image/png" in content["data"] for content in run.of("display_data"))  # shown in the cell
    assert py.value("(type(f).__module__.split('.')[0], f.size)") == repr(("PIL", (30, 20)))

    scripted_lm.add(
        "write a report",
        [
            step("write", "open('/workspace/artifacts/report.csv', 'w').write('a,b\\n1,2\\n')"),
            step("done", "SUBMIT(answer='artifacts/report.csv')"),
        ],
    )
    py.ok("%%fleet --out report:path\nwrite a report")
    assert py.value("report.read_text()") == repr("a,b\n1,2\n")


@pytest.mark.slow
def test_what_cannot_come_back_is_refused(py: PythonKernel, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add(
        "pickle it",
        [
            step(
                "save",
                "import numpy as np\n"
                "np.save('/workspace/artifacts/o.npy', np.array([{'a': 1}, None], dtype=object), allow_pickle=True)",
            ),
            step("done", "SUBMIT(answer='saved')"),
        ],
    )
    run = py.run("%%fleet --out o:arr\npickle it", timeout=90)
    content = run.reply["content"]
    assert content["ename"] == "RefusedValue" and "allow_pickle" in content["evalue"], content
    assert "NAME:df" in content["evalue"]  # the error says what can come back
    assert py.value("'o' in globals()") == "False"

    # an earlier turn's file is not this turn's value
    scripted_lm.add("nothing saved", [step("done", "SUBMIT(answer='no')")])
    run = py.run("%%fleet --out o:arr\nnothing saved", timeout=90)
    assert run.reply["content"]["ename"] == "RefusedValue" and "did not write" in run.reply["content"]["evalue"]

    run = py.run("%%fleet --out x:pickle\nanything", timeout=30)
    content = run.reply["content"]
    assert (
        content["ename"] == "UsageError" and "cannot come back" in content["evalue"] and "NAME:fig" in content["evalue"]
    )
