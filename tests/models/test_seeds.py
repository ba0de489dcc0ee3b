"""The five seed tutorials as pipelines: every printed number of their deterministic parts
(to 1e-4, as printed), every printed shape of the others, and which lints each one trips."""

import functools
import json

import pytest
import torch

import tracer
from tests.conftest import PIPELINES
from tracer.cli import main


def matches_printed(actual, printed, atol=1e-4):
    expected = torch.tensor(printed, dtype=actual.dtype)
    assert actual.shape == expected.shape, f"shape {list(actual.shape)} vs printed {list(expected.shape)}"
    assert torch.allclose(actual, expected, atol=atol, rtol=0), f"\n{actual}\nvs printed\n{expected}"


SEEDS = PIPELINES / "seeds"


@functools.cache
def values(name: str):
    return tracer.load(SEEDS / f"{name}.yaml").run(keep_values=True)


EMBEDDED = [
    [0.3374, -0.1778],
    [0.1794, 1.8951],
    [0.3486, 0.6603],
    [0.4954, 0.2692],
    [0.6984, -1.4097],
    [0.7671, -1.1925],
    [0.3486, 0.6603],
    [-0.2196, -0.3792],
]


QUERIES = [
    [0.0081, -0.0375, -0.1291],
    [1.0321, 1.3501, 1.6555],
    [0.4443, 0.5424, 0.5980],
    [0.2858, 0.3100, 0.2699],
    [-0.5214, -0.7949, -1.1699],
    [-0.3889, -0.6280, -0.9766],
    [0.4443, 0.5424, 0.5980],
    [-0.2609, -0.3164, -0.3448],
]


KEYS = [
    [0.0279, -0.0671, -0.0158],
    [0.2187, 1.4097, 1.3587],
    [0.1153, 0.5439, 0.5636],
    [0.0953, 0.2867, 0.3412],
    [-0.0491, -0.8956, -0.7485],
    [-0.0174, -0.7251, -0.5775],
    [0.1153, 0.5439, 0.5636],
    [-0.0689, -0.3159, -0.3298],
]


VALUES = [
    [-0.0094, 0.0353, -0.1071, 0.0115],
    [0.3862, 0.8181, 1.5893, 1.3203],
    [0.1562, 0.3756, 0.5877, 0.5693],
    [0.0904, 0.2649, 0.2815, 0.3671],
    [-0.2244, -0.3454, -1.0836, -0.6643],
    [-0.1765, -0.2364, -0.8957, -0.4945],
    [0.1562, 0.3756, 0.5877, 0.5693],
    [-0.0912, -0.2218, -0.3398, -0.3344],
]


OMEGA_2 = [-0.0879, 4.3783, 1.7863, 1.0502, -2.4988, -1.9530, 1.7863, -1.0434]


WEIGHTS_2 = [[0.0432, 0.5687, 0.1273, 0.0832, 0.0107, 0.0147, 0.1273, 0.0249]]


CONTEXT_2 = [[0.2593, 0.5718, 1.0390, 0.9041]]


PRINTED_000 = {
    "embedded_sentence": EMBEDDED,
    "W_query": [[0.2961, 0.5166], [0.2517, 0.6886], [0.0740, 0.8665]],
    "W_key": [[0.1366, 0.1025], [0.1841, 0.7264], [0.3153, 0.6871]],
    "W_value": [[0.0756, 0.1966], [0.3164, 0.4017], [0.1186, 0.8274], [0.3821, 0.6605]],
    "x_2": [0.1794, 1.8951],
    "query_2": [1.0321, 1.3501, 1.6555],
    "key_2": [0.2187, 1.4097, 1.3587],
    "value_2": [0.3862, 0.8181, 1.5893, 1.3203],
    "queries": QUERIES,
    "keys": KEYS,
    "values": VALUES,
    "omega_24": -2.4988,
    "omega_2": OMEGA_2,
    "omega_2_row": [OMEGA_2],
    "attention_weights_2": WEIGHTS_2,
    "context_vector_2": CONTEXT_2,
}


PRINTED_000_MULTIHEAD = {
    "multihead_W_query": [
        [[0.8536, 0.5932], [0.6367, 0.9826], [0.2745, 0.6584]],
        [[0.2775, 0.8573], [0.8993, 0.0390], [0.9268, 0.7388]],
        [[0.7179, 0.7058], [0.9156, 0.4340], [0.0772, 0.3565]],
    ],
    "multihead_query_2": [[1.2772, 1.9764, 1.2970], [1.6745, 0.2353, 1.5663], [1.4664, 0.9867, 0.6895]],
    "multihead_key_2": [[1.0367, 0.5123, 1.9268], [1.0603, 1.1722, 1.6966], [1.2750, 1.4245, 0.1450]],
    "multihead_value_2": [[1.7906, 0.2750, 1.8344, 0.3146], [1.0396, 0.9122, 1.3936, 1.6952], [0.2099, 1.0958, 0.1481, 1.7002]],
    "multihead_keys": [
        [
            [-0.0449, 0.0960, -0.0198],
            [1.0367, 0.5123, 1.9268],
            [0.4035, 0.2948, 0.8014],
            [0.2168, 0.2639, 0.4873],
            [-0.6482, -0.0428, -1.0552],
            [-0.5222, 0.0355, -0.8125],
            [0.4035, 0.2948, 0.8014],
            [-0.2346, -0.1772, -0.4690],
        ],
        [
            [0.0637, 0.0395, 0.1757],
            [1.0603, 1.1722, 1.6966],
            [0.5012, 0.5292, 0.8617],
            [0.3671, 0.3648, 0.6854],
            [-0.4056, -0.5210, -0.4756],
            [-0.2619, -0.3663, -0.2355],
            [0.5012, 0.5292, 0.8617],
            [-0.2968, -0.3121, -0.5132],
        ],
        [
            [0.1204, 0.0852, 0.1406],
            [1.2750, 1.4245, 0.1450],
            [0.6381, 0.6731, 0.1751],
            [0.4995, 0.4927, 0.2252],
            [-0.3849, -0.5457, 0.2543],
            [-0.2061, -0.3526, 0.2919],
            [0.6381, 0.6731, 0.1751],
            [-0.3796, -0.3985, -0.1090],
        ],
    ],
}


PRINTED_001_NO_WEIGHTS = {
    "attention_scores": [
        [0.9995, 0.9544, 0.9422, 0.4753, 0.4576, 0.6310],
        [0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865],
        [0.9422, 1.4754, 1.4570, 0.8296, 0.7154, 1.0605],
        [0.4753, 0.8434, 0.8296, 0.4937, 0.3474, 0.6565],
        [0.4576, 0.7070, 0.7154, 0.3474, 0.6654, 0.2935],
        [0.6310, 1.0865, 1.0605, 0.6565, 0.2935, 0.9450],
    ],
    "attention_weights": [
        [0.2098, 0.2006, 0.1981, 0.1242, 0.1220, 0.1452],
        [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581],
        [0.1390, 0.2369, 0.2326, 0.1242, 0.1108, 0.1565],
        [0.1435, 0.2074, 0.2046, 0.1462, 0.1263, 0.1720],
        [0.1526, 0.1958, 0.1975, 0.1367, 0.1879, 0.1295],
        [0.1385, 0.2184, 0.2128, 0.1420, 0.0988, 0.1896],
    ],
    "z_2": [0.4419, 0.6515, 0.5683],
    "Z": [
        [0.4421, 0.5931, 0.5790],
        [0.4419, 0.6515, 0.5683],
        [0.4431, 0.6496, 0.5671],
        [0.4304, 0.6298, 0.5510],
        [0.4671, 0.5910, 0.5266],
        [0.4177, 0.6503, 0.5645],
    ],
}


PRINTED_001_TRAINABLE = {
    "attention_weights": [
        [0.1747, 0.1866, 0.1864, 0.1446, 0.1586, 0.1491],
        [0.1862, 0.2123, 0.2117, 0.1179, 0.1450, 0.1269],
        [0.1859, 0.2118, 0.2112, 0.1184, 0.1454, 0.1273],
        [0.1798, 0.1936, 0.1932, 0.1365, 0.1542, 0.1427],
        [0.1751, 0.1895, 0.1893, 0.1418, 0.1579, 0.1465],
        [0.1837, 0.2003, 0.1998, 0.1293, 0.1501, 0.1369],
    ],
    "values": [
        [0.4976, 0.9655, 0.7614],
        [0.9074, 1.3518, 1.5075],
        [0.8976, 1.3391, 1.4994],
        [0.5187, 0.7319, 0.8493],
        [0.4699, 0.7336, 0.9307],
        [0.6446, 0.9045, 0.9814],
    ],
    "z_2": [0.6860, 1.0570, 1.1383],
    "Z": [
        [0.6692, 1.0276, 1.1106],
        [0.6864, 1.0577, 1.1389],
        [0.6860, 1.0570, 1.1383],
        [0.6738, 1.0361, 1.1180],
        [0.6711, 1.0307, 1.1139],
        [0.6783, 1.0441, 1.1252],
    ],
}


PRINTED_002 = {
    "Q": [
        [
            [-0.3506, -1.0175, -0.2295, -0.1465],
            [-0.5866, -1.0891, 1.0656, -0.9749],
            [-0.5760, -0.2903, 0.1999, 0.0190],
            [0.0995, 0.5813, -0.0833, 0.2916],
            [0.5175, 0.4328, -0.0241, -0.0586],
            [-0.0626, 0.4078, -0.6414, 0.7465],
        ]
    ],
    "K": [
        [
            [0.3377, -1.2272, -1.1369, -0.8416],
            [0.3797, -0.2600, -0.7065, 0.0536],
            [-0.2234, -0.5780, -0.4410, -0.0206],
            [-0.3062, 0.4182, 0.5037, 0.3420],
            [0.1550, 0.6600, 0.5854, 0.2086],
            [-0.5557, 0.0838, 0.1256, -0.0084],
        ]
    ],
    "attention_scores": [
        [
            [
                [1.1303, 0.1314, 0.6665, -0.3182, -0.7259, 0.1096],
                [1.1384, 0.0604, 0.7605, -0.2759, -0.8097, 0.2347],
                [0.1617, -0.1433, 0.2965, 0.0550, -0.2809, 0.2958],
                [-0.6798, -0.1134, -0.3582, 0.2127, 0.3991, -0.0065],
                [-0.3563, 0.0840, -0.3658, 0.0226, 0.3658, -0.2513],
                [-0.5216, -0.1298, -0.2217, 0.1897, 0.2594, 0.0690],
            ],
            [
                [0.3842, 0.1543, 0.1042, -0.1657, -0.1649, -0.0276],
                [-0.3910, -0.8052, -0.4498, 0.2033, 0.4204, 0.1420],
                [-0.2432, -0.1402, -0.0885, 0.1072, 0.1210, 0.0249],
                [-0.1507, 0.0745, 0.0307, 0.0578, 0.0120, -0.0129],
                [0.0767, 0.0139, 0.0118, -0.0322, -0.0263, -0.0025],
                [0.1009, 0.4932, 0.2674, -0.0677, -0.2197, -0.0868],
            ],
        ]
    ],
    "attention_weights": [
        [
            [
                [1.0000, 0, 0, 0, 0, 0],
                [0.6818, 0.3182, 0, 0, 0, 0],
                [0.3441, 0.2774, 0.3785, 0, 0, 0],
                [0.1777, 0.2652, 0.2231, 0.3340, 0, 0],
                [0.1579, 0.2156, 0.1569, 0.2064, 0.2632, 0],
                [0.1181, 0.1559, 0.1460, 0.1954, 0.2052, 0.1794],
            ],
            [
                [1.0000, 0, 0, 0, 0, 0],
                [0.5727, 0.4273, 0, 0, 0, 0],
                [0.3134, 0.3370, 0.3496, 0, 0, 0],
                [0.2238, 0.2624, 0.2544, 0.2593, 0, 0],
                [0.2098, 0.2006, 0.2004, 0.1942, 0.1950, 0],
                [0.1665, 0.2198, 0.1873, 0.1478, 0.1327, 0.1458],
            ],
        ]
    ],
}


EXPECTED_WARNINGS = {
    "000_self_attention_x2": set(),
    "000_multihead_stacked": set(),
    "000_encoder_block": set(),
    "000_lossy_head_split": {"lossy-head-split"},
    "001_self_attention_no_weights": set(),
    "001_self_attention_trainable": set(),
    "001_self_attention_class": set(),
    "001_self_attention_linear_class": set(),
    "002_weight_split_step_by_step": {"dim-mismatch"},  # the whole CONTEXT_SIZE mask on NUM_TOKENS scores
    "002_multi_head_attention_class": set(),
    "003_mha_step_by_step": set(),
    "003_multi_headed_attention_class": {"dead-step"},
    "004_toy_attention_example_1": {"scale-mismatch"},
    "004_toy_attention_example_3": {"scale-mismatch"},
    "004_multi_head_attention_modulelist": set(),
}


@pytest.mark.parametrize("tensor", list(PRINTED_000))
def test_000_single_head_numbers(tensor):
    matches_printed(values("000_self_attention_x2")[tensor].tensor, PRINTED_000[tensor])


@pytest.mark.parametrize("tensor", list(PRINTED_000_MULTIHEAD))
def test_000_multihead_numbers(tensor):
    matches_printed(values("000_multihead_stacked")[tensor].tensor, PRINTED_000_MULTIHEAD[tensor])


def test_000_multihead_shapes():
    t = values("000_multihead_stacked")
    assert t["stacked_inputs"].shape == (3, 2, 8)
    assert t["multihead_keys_bmm"].shape == (3, 3, 8) and t["multihead_values_bmm"].shape == (3, 4, 8)
    assert t["multihead_keys"].shape == (3, 8, 3) and t["multihead_values"].shape == (3, 8, 4)
    # stacked_inputs holds embedded_sentence.T three times
    assert torch.equal(t["stacked_inputs"].tensor[2], t["embedded_sentence"].tensor.T)


def test_000_lossy_split_numbers_and_heads():
    t = values("000_lossy_head_split")
    matches_printed(t["combined_context"].tensor, [[0.2593, 0.5718, 1.0390]])
    for i in range(3):  # heads printed in cell [18]: the first three columns of values
        matches_printed(t[f"head_{i}"].tensor, [[row[i]] for row in VALUES])
    assert t["combined_context"].shape == (1, 3)  # not (1, d_v): one column is lost


def test_000_encoder_block_shapes():
    t = tracer.load(SEEDS / "000_encoder_block.yaml").run()
    printed = {
        "x_in": (1, 8, 2),
        "Q": (1, 8, 2),
        "K": (1, 8, 2),
        "V": (1, 8, 2),
        "Q_heads": (1, 2, 8, 1),
        "scores": (1, 2, 8, 8),
        "attn_weights": (1, 2, 8, 8),
        "context": (1, 2, 8, 1),
        "context_merged": (1, 8, 2),
        "mha_out": (1, 8, 2),
        "normed_1": (1, 8, 2),
        "ffn_out": (1, 8, 2),
        "encoder_out": (1, 8, 2),
    }
    assert {k: t[k].shape for k in printed} == printed
    assert t["hidden"].shape == (1, 8, 4)


@pytest.mark.parametrize("tensor", list(PRINTED_001_NO_WEIGHTS))
def test_001_without_weights_numbers(tensor):
    matches_printed(values("001_self_attention_no_weights")[tensor].tensor, PRINTED_001_NO_WEIGHTS[tensor])


@pytest.mark.parametrize("tensor", list(PRINTED_001_TRAINABLE))
def test_001_trainable_numbers(tensor):
    matches_printed(values("001_self_attention_trainable")[tensor].tensor, PRINTED_001_TRAINABLE[tensor])


def test_001_partial_sums_of_z_2():
    """Cell [48] prints the running sum alpha_2[0] v_0 + ... ; its last line is z_2."""
    t = values("001_self_attention_trainable")
    alpha, v = t["alpha_2"].tensor, t["values"].tensor
    partial = torch.cumsum(alpha[:, None] * v, dim=0)
    matches_printed(
        partial,
        [
            [0.0925, 0.1795, 0.1416],
            [0.2847, 0.4658, 0.4608],
            [0.4742, 0.7485, 0.7775],
            [0.5356, 0.8352, 0.8780],
            [0.6040, 0.9419, 1.0133],
            [0.6860, 1.0570, 1.1383],
        ],
    )


@pytest.mark.parametrize("name", ["001_self_attention_class", "001_self_attention_linear_class"])
def test_001_class_shapes_at_tutorial_size(name):
    t = tracer.load(SEEDS / f"{name}.yaml").run(device="meta")  # 4096 x 4608: shapes without memory
    assert t["Z"].shape == (4096, 4608)
    assert t["attention_weights"].shape == (4096, 4096)


@pytest.mark.parametrize("tensor", list(PRINTED_002))
def test_002_step_by_step_numbers_from_printed_literals(tensor):
    """Inputs and weights are the 4-decimal printout, so agreement is ~1e-3, not 1e-4."""
    matches_printed(values("002_weight_split_step_by_step")[tensor].tensor, PRINTED_002[tensor], atol=1e-3)


def test_002_masked_scores_are_minus_inf_above_the_diagonal():
    masked = values("002_weight_split_step_by_step")["neg_inf_masked_attention_scores"].tensor
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    assert torch.isneginf(masked[..., future]).all() and torch.isfinite(masked[..., ~future]).all()


def test_002_shapes():
    t = values("002_weight_split_step_by_step")
    printed = {
        "input_embeddings": (1, 6, 4),
        "Q": (1, 6, 4),
        "Q_reshaped": (1, 6, 2, 2),
        "Q_regrouped": (1, 2, 6, 2),
        "attention_scores": (1, 2, 6, 6),
        "mask": (6, 6),
        "neg_inf_masked_attention_scores": (1, 2, 6, 6),
        "attention_weights": (1, 2, 6, 6),
        "attention_weights_dropout": (1, 2, 6, 6),
        "context_vectors": (1, 2, 6, 2),
        "context_vectors_regrouped": (1, 6, 2, 2),
        "context_vectors_reshaped": (1, 6, 4),
    }
    assert {k: t[k].shape for k in printed} == printed
    assert not t["context_vectors_regrouped"].contiguous and t["context_vectors_contiguous"].contiguous
    c = tracer.load(SEEDS / "002_multi_head_attention_class.yaml").run()
    assert c["input_embeddings"].shape == (2, 6, 4) and c["output"].shape == (2, 6, 4)


def test_003_step_by_step_shapes():
    t = values("003_mha_step_by_step")
    printed = {
        "input": (2, 3, 8),
        "queries": (2, 3, 8),
        "keys": (2, 3, 8),
        "values": (2, 3, 8),
        "queries_view": (2, 3, 2, 4),
        "keys_view": (2, 3, 2, 4),
        "values_view": (2, 3, 2, 4),
        "queries_heads": (2, 2, 3, 4),
        "keys_heads": (2, 2, 3, 4),
        "values_heads": (2, 2, 3, 4),
        "keys_transposed": (2, 2, 4, 3),
        "attention_scores": (2, 2, 3, 3),
        "mask_random": (2, 1, 3, 3),
        "attention_scores_masked": (2, 2, 3, 3),
        "attention_weights": (2, 2, 3, 3),
        "attention_heads": (2, 2, 3, 4),
        "attention_heads_transposed": (2, 3, 2, 4),
        "attention_heads_concat": (2, 3, 8),
        "multi_head_attention_output": (2, 3, 8),
    }
    assert {k: t[k].shape for k in printed} == printed
    # cell [24]: is_contiguous False before reshape, True after
    assert not t["attention_heads_transposed"].contiguous and t["attention_heads_concat"].contiguous


def test_003_fully_masked_row_is_uniform_with_minus_1e9():
    """Cell [20]: with -1e9 the fully masked row (batch 1, query 1) is 0.3333 each, not NaN;
    rows that keep one key are exactly 1 there (as printed)."""
    w = values("003_mha_step_by_step")["attention_weights"].tensor
    matches_printed(w[1, :, 1], [[1 / 3] * 3] * 2)
    matches_printed(w[0, :, 1], [[1.0, 0.0, 0.0]] * 2)
    matches_printed(w[1, :, 2], [[1.0, 0.0, 0.0]] * 2)
    assert not w.isnan().any()


def test_003_class_shapes():
    t = tracer.load(SEEDS / "003_multi_headed_attention_class.yaml").run()
    assert t["output"].shape == (2, 3, 8)
    assert t["attention_heads"].shape == (2, 2, 3, 4)


def test_004_example_1_output_and_weights():
    t = values("004_toy_attention_example_1")
    matches_printed(t["output"].tensor, [[1.0000e01, 2.1216e-21, 2.0000e00]])
    matches_printed(t["attention_weights"].tensor, [[1.9287e-22, 1.0000e00, 1.9287e-22, 1.9287e-22]])
    # the tiny entries themselves, relatively
    assert torch.allclose(t["attention_weights"].tensor[0, 0], torch.tensor(1.9287e-22), rtol=1e-4, atol=0)
    assert torch.allclose(t["output"].tensor[0, 1], torch.tensor(2.1216e-21), rtol=1e-4, atol=0)


def test_004_example_3_weights():
    weights = values("004_toy_attention_example_3")["attention_weights"].tensor
    matches_printed(torch.round(weights, decimals=3), [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 0.0, 0.0]])
    assert values("004_toy_attention_example_3")["output"].shape == (3, 3)


def test_004_modulelist_shapes():
    t = tracer.load(SEEDS / "004_multi_head_attention_modulelist.yaml").run()
    assert t["toy_encodings"].shape == (1, 3, 4)
    assert t["attn_weights"].shape == (1, 2, 3, 3)  # printed
    assert t["attn_weights_stacked"].shape == (2, 1, 3, 3)
    assert t["output"].shape == (1, 3, 4) and t["projection"].shape == (1, 3, 4)
    assert t["Q_0"].shape == (1, 3, 2) and t["K_0_permuted"].shape == (1, 2, 3)


def test_every_seed_file_is_listed():
    assert {p.stem for p in SEEDS.glob("*.yaml")} == set(EXPECTED_WARNINGS)
    for number in range(5):
        assert any(name.startswith(f"00{number}_") for name in EXPECTED_WARNINGS)


@pytest.mark.parametrize("name", sorted(EXPECTED_WARNINGS))
def test_seed_diagnostics(name):
    analysis = tracer.load(SEEDS / f"{name}.yaml").check()
    assert not analysis.errors
    assert {d.code for d in analysis.warnings} == EXPECTED_WARNINGS[name], [str(d) for d in analysis.warnings]


def test_clean_seeds_pass_strict(capsys):
    clean = [str(SEEDS / f"{n}.yaml") for n, codes in EXPECTED_WARNINGS.items() if not codes]
    assert main(["check", "--strict", *clean]) == 0
    shown = capsys.readouterr().err.splitlines()
    assert all("allowed[unused-tensor]" in line and "advances the RNG" in line for line in shown)  # 000's RNG-only params
    assert len(shown) == 3


def test_run_json_values_shows_the_printed_numbers(capsys):
    assert main(["run", str(SEEDS / "000_self_attention_x2.yaml"), "--json", "--values"]) == 0
    data = json.loads(capsys.readouterr().out)
    tensors = {t["id"]: t for t in data["tensors"]}
    matches_printed(torch.tensor(tensors["context_vector_2"]["values"]), CONTEXT_2)
    matches_printed(torch.tensor(tensors["omega_2"]["values"]), OMEGA_2)
    matches_printed(torch.tensor(tensors["embedded_sentence"]["values"]), EMBEDDED)
