"""CheXpercept conversations (CHEXPERCEPT.md §13): turn texts, images per turn, history and oracle settings."""

from __future__ import annotations

import base64

import pytest

from cxrground.evaluation.percept.conversation import Conversation, image_data_url, plan_case
from cxrground.evaluation.percept.parsing import is_correct, parse_answer
from cxrground.percept.schema import load_benchmark
from cxrground.testing.mock_bench import make_benchmark

SYSTEM = ("You are an expert radiologist. Analyze the given chest X-ray image and the question. Provide the final "
          "answer in the following format: 'Answer: [Option Number]'. Only the option number(s) should be included "
          "in the final answer part. (e.g., 'Answer: 1', 'Answer: 2', 'Answer: 1,3').")
O1 = ("Ground Truth Provided: The lesion is definitively present in this image. This is an absolute fact. Disregard "
      "your previous answer and evaluate the following questions strictly based on the confirmed presence of the "
      "lesion.")
O2 = ("Ground Truth Provided: The lesion mask is definitively needed to be revised in this image. This is an "
      "absolute fact. Disregard your previous answer and evaluate the following questions strictly based on the "
      "confirmed need of revision.")
O4 = ("Ground Truth Provided: The lesion mask is definitively not needed to be revised in this image. This is an "
      "absolute fact. Disregard your previous answer and evaluate the following questions strictly based on the "
      "confirmed no need of revision of the lesion mask.")
CONTEXT = ("The colored points indicate potential locations where the mask may need to be adjusted. The mask may "
           "need to be expanded towards these points, contracted at these locations, or both. Note that lesions "
           "overlapping with the heart do not need to be considered.")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    root = make_benchmark(tmp_path_factory.mktemp("bench"), {"LF": 1, "RF": 1, "RR": 2}, seed=3)
    return load_benchmark(root)


def _texts(msg):
    return [p["text"] for p in msg["content"] if p["type"] == "text"]


def _images(msg):
    return [p["image_url"]["url"] for p in msg["content"] if p["type"] == "image_url"]


def _run(plan, setting, answers):
    """Run the conversation with scripted (raw, correct) answers; returns the request of every turn."""
    conv = Conversation(plan, setting, lambda rel: f"img:{rel}")
    requests = []
    for raw, correct in answers:
        requests.append(conv.next_request())
        conv.record(raw, correct)
    assert conv.done
    return requests, conv


def _wrong_answer(q):
    return "Answer: 9"


def test_rr_turns_texts_and_images_none_setting(bench):
    key = "edema_prr0"
    case, plan = bench.cases[key], plan_case(key, bench.cases[key])
    assert [q.qid for q in plan.questions] == ["detection", "contour_eval", "expansion", "contraction",
                                               "revision_result", "distribution", "location", "severity",
                                               "comparison"]
    answers = [(f"raw {i}", False) for i in range(9)]
    reqs, _ = _run(plan, "none", answers)
    cq, attrs = case.contour_qa, case.attribute_extraction_qa
    expected_text = [case.detection_qa.question, cq.contour_eval_qa.question,
                     CONTEXT + "\n\n" + cq.contour_revision_qa_expansion.question,
                     cq.contour_revision_qa_contraction.question, cq.contour_revision_qa_revision_result.question,
                     attrs.distribution.question, attrs.location.question, attrs.severity.question,
                     attrs.comparison.question]
    expected_images = [[case.detection_qa.relative_path], [cq.contour_eval_qa.relative_path],
                       [cq.contour_revision_qa_expansion.relative_path], [],
                       [o.relative_path for o in cq.contour_revision_qa_revision_result.answer_options],
                       [], [], [], []]
    assert len(expected_images[4]) == 4
    for t, req in enumerate(reqs):
        assert req[0] == {"role": "system", "content": SYSTEM}
        assert len(req) == 2 + 2 * t
        assert _texts(req[-1]) == [expected_text[t]]
        assert _images(req[-1]) == [f"img:{p}" for p in expected_images[t]]
        for k in range(t):  # full history: user text + images re-sent, then the raw response
            assert _texts(req[1 + 2 * k]) == [expected_text[k]]
            assert _images(req[1 + 2 * k]) == [f"img:{p}" for p in expected_images[k]]
            assert req[2 + 2 * k] == {"role": "assistant", "content": f"raw {k}"}
    assert sum(len(_images(m)) for m in reqs[-1] if m["role"] == "user") == 7
    assert case.detection_qa.question == (
        "Is any finding suggestive of edema visible in the image?\n\nOptions:\n(1) Yes\n(2) No")


def test_implicit_replaces_wrong_answers_and_keeps_the_original(bench):
    key = "edema_prr0"
    plan = plan_case(key, bench.cases[key])
    gt = {q.qid: q.gt for q in plan.questions}
    # wrong: detection, expansion, revision result; right: the rest
    wrong = {"detection", "expansion", "revision_result"}
    answers = [(f"<think>x</think>raw {q.qid}", q.qid not in wrong) for q in plan.questions]
    reqs, conv = _run(plan, "implicit", answers)
    assert reqs[0][-1]["content"][0]["text"] == plan.questions[0].text  # no oracle on turn 1
    assert reqs[1][2] == {"role": "assistant", "content": "Answer: 1"}  # detection replaced before Stage 2
    assert reqs[2][4]["content"] == "<think>x</think>raw contour_eval"  # correct contour evaluation kept
    assert reqs[3][6]["content"] == "<think>x</think>raw expansion"  # not replaced before 3c
    exp_gt = ",".join(str(i) for i in sorted(gt["expansion"]))
    assert reqs[4][6] == {"role": "assistant", "content": f"Answer: {exp_gt}"}
    assert reqs[4][8]["content"] == "<think>x</think>raw contraction"
    assert reqs[5][10] == {"role": "assistant", "content": f"Answer: {gt['revision_result'][0]}"}
    # the replacement persists and no user text carries an oracle text
    assert reqs[8][2]["content"] == "Answer: 1"
    assert all("Ground Truth" not in t for r in reqs for m in r if m["role"] == "user" for t in _texts(m))
    # originals kept
    det = conv.turns[0]
    assert det.raw == "<think>x</think>raw detection" and det.replaced and det.history_text == "Answer: 1"


def test_explicit_prefixes_and_texts(bench):
    key = "edema_prr0"
    case = bench.cases[key]
    plan = plan_case(key, case)
    q = {x.qid: x for x in plan.questions}
    reqs, _ = _run(plan, "explicit", [("r", False)] * 9)
    assert _texts(reqs[1][-1]) == [O1 + "\n\n" + q["contour_eval"].text]
    assert _texts(reqs[2][-1]) == [O2 + "\n\n" + CONTEXT + "\n\n" + q["expansion"].text]
    assert reqs[1][2]["content"] == "r"  # explicit keeps the model's own answer in the history
    colors = {x.qid: [x.options[i - 1].split()[0] for i in x.gt if x.options[i - 1] != "None"]
              for x in plan.questions if x.qid in ("expansion", "contraction")}

    def line(op):
        c = colors[op]
        if not c:
            return ("Ground Truth Provided: The lesion mask is definitively not needed to be revised using "
                    f"{op} operation.")
        pts = c[0] + " point" if len(c) == 1 else (f"{c[0]} and {c[1]} points" if len(c) == 2
                                                    else ", ".join(c[:-1]) + f", and {c[-1]} points")
        return ("Ground Truth Provided: The lesion mask is definitively needed to be revised using "
                f"{op} operation at {pts}.")

    o3 = (line("expansion") + "\n" + line("contraction") + "\nThese are the absolute facts. Disregard your previous "
          "answer and evaluate the following questions strictly based on these facts.")
    assert _texts(reqs[4][-1]) == [o3 + "\n\n" + q["revision_result"].text]
    ordinal = {1: "1st", 2: "2nd", 3: "3rd", 4: "4th"}[q["revision_result"].gt[0]]
    o5 = (f"Ground Truth Provided: The lesion mask reflecting the modifications is the {ordinal} mask.\nThis is an "
          "absolute fact. Disregard your previous answer and evaluate the following questions strictly based on this "
          "fact.")
    assert _texts(reqs[5][-1]) == [o5 + "\n\n" + q["distribution"].text]
    assert _texts(reqs[6][-1]) == [q["location"].text]  # only the first attribute turn
    # the sent text (with the oracle) is what the history repeats
    assert _texts(reqs[8][3]) == [O1 + "\n\n" + q["contour_eval"].text]


def test_explicit_rf_uses_o4_and_correct_answers_trigger_nothing(bench):
    key = "edema_prf0"
    plan = plan_case(key, bench.cases[key])
    assert [x.qid for x in plan.questions] == ["detection", "contour_eval", "distribution", "location", "severity",
                                               "comparison"]
    reqs, _ = _run(plan, "explicit", [("r", True), ("r", False), ("r", True), ("r", True), ("r", True), ("r", True)])
    assert _texts(reqs[1][-1]) == [plan.questions[1].text]
    assert _texts(reqs[2][-1]) == [O4 + "\n\n" + plan.questions[2].text]
    # all correct: the three settings send identical requests
    right = [("Answer: 1", True)] * len(plan.questions)
    runs = [_run(plan, s, right)[0] for s in ("none", "implicit", "explicit")]
    assert runs[0] == runs[1] == runs[2]


def test_implicit_rf_replaces_contour_eval_before_stage4(bench):
    plan = plan_case("edema_prf0", bench.cases["edema_prf0"])
    reqs, _ = _run(plan, "implicit", [("r", True), ("r", False)] + [("r", True)] * 4)
    assert reqs[2][4] == {"role": "assistant", "content": "Answer: 2"}


def test_cardiomegaly_and_lf_plans(bench):
    rr = plan_case("cardiomegaly_prr0", bench.cases["cardiomegaly_prr0"])
    assert [q.qid for q in rr.questions] == ["detection", "contour_eval", "expansion", "contraction", "revision_result"]
    reqs, _ = _run(rr, "explicit", [("r", False)] * 5)
    assert "Note that lesions overlapping" not in _texts(reqs[2][-1])[0]
    lf = plan_case("edema_plf0", bench.cases["edema_plf0"])
    assert lf.path == "LF" and [q.qid for q in lf.questions] == ["detection"] and lf.questions[0].gt == (2,)
    reqs, _ = _run(lf, "implicit", [(None, False)])
    assert len(reqs) == 1


def test_none_response_is_kept_as_empty_history(bench):
    plan = plan_case("edema_prf0", bench.cases["edema_prf0"])
    conv = Conversation(plan, "none", lambda rel: rel)
    conv.next_request()
    conv.record(None, False)
    assert conv.next_request()[2] == {"role": "assistant", "content": ""}
    with pytest.raises(ValueError):
        Conversation(plan, "sometimes", lambda rel: rel)


def test_image_data_url_is_png_base64(bench, tmp_path):
    path = bench.root / bench.cases["edema_plf0"].detection_qa.relative_path
    url = image_data_url(path)
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == path.read_bytes()
    from PIL import Image

    Image.new("L", (4, 4), 7).save(tmp_path / "x.jpg")
    converted = base64.b64decode(image_data_url(tmp_path / "x.jpg").split(",", 1)[1])
    assert converted.startswith(b"\x89PNG")


def test_o3_names_colours_in_stored_gt_order(bench):
    """O3 lists the GT points' colours in the stored answer_index order (the reference's order; "colours in GT index
    order", §13.3); the implicit answer and the scored GT stay sorted."""
    key = "edema_prr0"
    case = bench.cases[key].model_copy(deep=True)
    exp = case.contour_qa.contour_revision_qa_expansion
    assert [o.color for o in exp.answer_options][:2] == ["red", "orange"] and exp.answer_index == [1, 2]
    exp.answer_index = [2, 1]  # stored unsorted, as the released JSON can be
    plan = plan_case(key, case)
    q = {x.qid: x for x in plan.questions}
    assert q["expansion"].gt == (1, 2) and q["expansion"].gt_stored == (2, 1)
    answers = [("r", True), ("r", True), ("r", False)] + [("r", True)] * 6
    reqs, _ = _run(plan, "explicit", answers)
    o3 = _texts(reqs[4][-1])[0]
    assert o3.startswith("Ground Truth Provided: The lesion mask is definitively needed to be revised using expansion "
                         "operation at orange and red points.\n")
    reqs, _ = _run(plan, "implicit", answers)
    assert reqs[4][6] == {"role": "assistant", "content": "Answer: 1,2"}
    for reply in ("Answer: 1,2", "Answer: 2,1"):  # scored as a set, whatever the stored or replied order
        numbers = parse_answer(reply, q["expansion"].options, True).numbers
        assert is_correct(numbers, q["expansion"].gt, q["expansion"].multi)
        assert is_correct(numbers, q["expansion"].gt_stored, q["expansion"].multi)


def test_the_plan_does_not_depend_on_component_keys_or_mask_names(bench):
    """Benchmarks built with other component keys (``"0"``) or mask names plan the same conversation."""
    key = "edema_prr0"
    new, old = bench.cases[key].model_copy(deep=True), bench.cases[key].model_copy(deep=True)
    new.contour_qa.true_masks = {"suboptimal_component_0": ["suboptimal_component_0_no_contraction"]}
    new.contour_qa.fake_masks = {"suboptimal_component_0": ["default_keep"]}
    old.contour_qa.true_masks = {"0": ["optimal_component_0"]}
    old.contour_qa.fake_masks = {"0": ["default_keep"]}
    a, b = plan_case(key, new), plan_case(key, old)
    assert [(q.qid, q.text, q.images, q.options, q.gt) for q in a.questions] == \
        [(q.qid, q.text, q.images, q.options, q.gt) for q in b.questions]
