"""The GPT with experts built by Graph.gpt: its dropped-token count is
exactly what a NumPy reference of GShard's routing gives on the gates
the model computed, for top-1, top-2 and top-3 with capacities that drop;
its auxiliary loss is the reference's; the refusals name their numbers."""
import math

import numpy as np
import pytest

import libspmd
from numpy_reference import gshard_aux_loss, gshard_routing

VOCAB, SEQ, BATCH, EXPERTS = 13, 16, 8, 4


@pytest.mark.parametrize("top_k,factor", [(1, 1.0), (2, 1.0), (3, 0.5)])
def test_dropped_count_is_the_numpy_routing(top_k, factor):
    g = libspmd.Graph()
    t = g.gpt(VOCAB, SEQ, 4, 2, 32, BATCH, experts=EXPERTS, top_k=top_k, capacity_factor=factor)
    gates = [g.find(f"h.{i}.moe.gates") for i in (1, 3)]
    for x in gates + [t["aux_loss"]]:
        g.mark_output(x)
    p = g.compile(seed=5)
    ids = np.random.default_rng(top_k).integers(0, VOCAB, (BATCH, SEQ), dtype=np.int32)
    p.set_input(t["input"], ids)
    p.set_input(t["targets"], ids)
    p.run()
    capacity = math.floor(top_k * SEQ * factor / EXPERTS)
    want, aux = 0, 0.0
    for x in gates:
        v = p.read(x)
        assert v.shape == (BATCH, SEQ, EXPERTS)
        dropped, first = gshard_routing(v, top_k, capacity)
        want += dropped
        aux += gshard_aux_loss(v, first)
    assert want > 0  # the capacity binds: the count is tested
    assert float(p.read(t["dropped"])) == want
    np.testing.assert_allclose(float(p.read(t["aux_loss"])), aux, rtol=1e-5)


def test_refusals_name_the_numbers():
    with pytest.raises(libspmd.InvalidError, match=r"top-k \(5\) must be from 1 to the number of experts \(4\)"):
        libspmd.Graph().gpt(VOCAB, SEQ, 2, 2, 32, BATCH, experts=4, top_k=5)
    with pytest.raises(libspmd.InvalidError, match="more experts than fit the capacity: 64 experts"):
        libspmd.Graph().gpt(VOCAB, SEQ, 2, 2, 32, BATCH, experts=64, top_k=1, capacity_factor=1.0)
