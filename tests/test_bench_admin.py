"""Runtime control under /bench/: swap the plan while serving, read the fault and request logs."""

from __future__ import annotations

from bench.server import ServerThread
from tests.server_helpers import request, turn_input


def test_plan_swap_takes_effect_on_the_next_request() -> None:
    with ServerThread("rlvr-500") as server:
        trajectory = server.context.store.trajectories[0]
        body = {"input_ids": turn_input(trajectory, 0), "return_logprob": True}
        assert "output_token_logprobs" in request(server.url, "/generate", body).json()["meta_info"]
        swapped = request(server.url, "/bench/plan", {"faults": ["missing_logprobs"], "seed": 9}, method="PUT")
        assert swapped.status == 200 and swapped.json()["replaced"] == "none"
        assert request(server.url, "/bench/plan").json()["rules"][0]["fault"] == "missing_logprobs"
        assert "output_token_logprobs" not in request(server.url, "/generate", body).json()["meta_info"]
        log = request(server.url, "/bench/faults").json()
        assert [e["fault"] for e in log["events"]] == ["missing_logprobs"] and log["never_fired"] == []
        toml = 'name = "t"\nseed = 1\n[[rules]]\nfault = "http_error"\nstatus = 502\n'
        assert request(server.url, "/bench/plan", {"toml": toml}, method="PUT").status == 200
        assert request(server.url, "/generate", body).status == 502
        assert request(server.url, "/bench/plan", {"faults": []}, method="PUT").status == 200
        assert request(server.url, "/generate", body).status == 200


def test_bad_plans_are_refused_and_the_old_one_kept() -> None:
    with ServerThread("rlvr-500", plan="seed-001") as server:
        bad = request(server.url, "/bench/plan", {"faults": ["nope:p=1"]}, method="PUT")
        assert bad.status == 400 and "unknown fault 'nope'; valid faults: abort," in bad.json()["error"]
        toml = request(server.url, "/bench/plan", {"toml": "seed = 1\n[[rules]]\nfault = 3\n"}, method="PUT")
        assert toml.status == 400 and toml.json()["error"].startswith("<request body>:")
        assert request(server.url, "/bench/plan", raw=b"{", method="PUT").status == 400
        assert request(server.url, "/bench/plan").json()["name"] == "seed-001"
