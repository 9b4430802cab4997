"""Continuation batches on real chat-completion output: prompts found where the config says,
a missing prompt named, custom_id unique across nodes, the model from the config."""

import json

from runhealth.analysis import continuation
from runhealth.node import agent


def sample(node, path="/data/out/s.jsonl", line=3, prompt="Prove it.", text="Proof: so"):
    return {"node": node, "path": path, "line_no": line, "prompt": prompt, "text": text}


def test_custom_id_is_unique_across_nodes_with_the_same_paths_and_the_model_is_set():
    built = continuation.build([sample("node-1"), sample("node-2"), sample("node-2")], 8192, 4096, "Qwen3-32B")
    assert [x["custom_id"] for x in built["lines"]] == ["node-1:/data/out/s.jsonl:3", "node-2:/data/out/s.jsonl:3"]
    body = built["lines"][0]["body"]
    assert body["model"] == "Qwen3-32B" and body["max_tokens"] == 4096
    assert body["messages"] == [{"role": "user", "content": "Prove it."}, {"role": "assistant", "content": "Proof: so"}]
    assert built["problems"] == []


def test_a_missing_prompt_is_named_with_the_field_to_set():
    built = continuation.build(
        [sample("node-1", prompt=None), sample("node-2", prompt=None)],
        8192,
        4096,
        None,
        {"node-1": None, "node-2": "metadata.prompt"},
    )
    assert built["lines"] == [] and built["missing_prompt"] == {"node-1": 1, "node-2": 1}
    text = "\n".join(built["problems"])
    assert "node-1: 1 truncated sample(s) left out: no prompt in the line" in text and "prompt_path" in text
    assert 'node-2: 1 truncated sample(s) left out: prompt_path = "metadata.prompt" found nothing there' in text
    assert "No [run] continuation_model set" in text


def test_a_message_list_prompt_is_kept_whole():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    built = continuation.build([sample("n", prompt=msgs)], 5000, 4096, "m")
    assert built["lines"][0]["body"]["messages"][:2] == msgs


def test_agent_reads_the_prompt_at_prompt_path_from_standard_chat_output(tmp_path):
    """Standard chat-completion output has no prompt; this generator keeps it under request.messages."""
    path = tmp_path / "out.jsonl"
    line = {
        "id": "c1",
        "object": "chat.completion",
        "request": {"messages": [{"role": "user", "content": "Sum 1..n"}]},
        "choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "We have"}}],
        "usage": {"completion_tokens": 4096},
    }
    plain = {k: v for k, v in line.items() if k != "request"}
    path.write_text(json.dumps(line) + "\n" + json.dumps(plain) + "\n")
    req = {
        "op": "sample",
        "globs": [str(path)],
        "n": 2,
        "seed": 1,
        "full_text": True,
        "prompt_path": "request.messages",
    }
    got = sorted(agent.handle(req)["samples"], key=lambda s: s["line_no"])
    assert got[0]["prompt"] == [{"role": "user", "content": "Sum 1..n"}] and got[0]["prompt_head"] == "Sum 1..n"
    assert got[1]["prompt"] is None  # no prompt there: the batch names it instead of guessing
