"""PaSE's four public graphs (Elango, IPDPS 2021; baidu-research/PaSE ``graph.py``), written with
:class:`harness.core.layer_builder.LayerGraphBuilder`: AlexNet, Inception-v3, the RNN language
model and the Transformer, operator for operator and in the same order as PaSE's code, with its
sizes (AlexNet's last layer has 1024 classes, the Transformer is PaSE's small one: 6 + 6 layers,
d_model 512, 8 heads, vocabulary 50000; RNNLM: 2 LSTM layers of 2048 units, vocabulary 100000,
256 steps). Under ``costs=pase`` a search on them solves the problem PaSE's code solves
(``python -m experiments pase_parity``). Registered as ``model=pase_alexnet``,
``pase_inception3``, ``pase_rnnlm`` and ``pase_transformer``.
"""

from __future__ import annotations

from harness.core.layer_builder import LayerGraphBuilder, Tensor, Weight
from harness.core.layergraph import LayerGraph


def alexnet(batch_size: int = 128) -> LayerGraph:
    """PaSE's AlexNet: five convolutions (ReLU fused), three max pools, three FC layers, softmax-cross-entropy."""
    b = LayerGraphBuilder("pase_alexnet", batch_size)
    x = b.input("image", (batch_size, 3, 227, 227))
    x = b.conv2d(x, 96, 11, stride=4, pw=1, name="conv1")
    x = b.pool2d(x, 3, stride=2, name="pool1")
    x = b.conv2d(x, 256, 5, pad=2, pw=1, name="conv2")
    x = b.pool2d(x, 3, stride=2, name="pool2")
    x = b.conv2d(x, 384, 3, pad=1, pw=1, name="conv3")
    x = b.conv2d(x, 384, 3, pad=1, pw=1, name="conv4")
    x = b.conv2d(x, 256, 3, pad=1, pw=1, name="conv5")
    x = b.pool2d(x, 3, stride=2, name="pool5")
    x = b.reshape(x, (batch_size, 256 * 6 * 6), name="flatten")
    x = b.linear(x, 4096, pw=1, name="fc6")
    x = b.linear(x, 4096, pw=1, name="fc7")
    x = b.linear(x, 1024, name="fc8")
    b.softmax_cross_entropy(x, name="loss")
    return b.build(source="baidu-research/PaSE graph.py AlexNet")


def inception3(batch_size: int = 128) -> LayerGraph:
    """PaSE's Inception-v3 (no auxiliary head): every convolution followed by a batch norm."""
    b = LayerGraphBuilder("pase_inception3", batch_size)

    def conv_bn(x: Tensor, out: int, kernel: int | tuple[int, int], stride: int = 1, pad: int | tuple[int, int] = 0) -> Tensor:
        return b.batchnorm(b.conv2d(x, out, kernel, stride=stride, pad=pad))

    def block_a(x: Tensor, pool_features: int) -> Tensor:
        b1 = conv_bn(x, 64, 1)
        b5 = conv_bn(conv_bn(x, 48, 1), 64, 5, pad=2)
        b3 = conv_bn(conv_bn(conv_bn(x, 64, 1), 96, 3, pad=1), 96, 3, pad=1)
        bp = conv_bn(b.pool2d(x, 3, stride=1, pad=1), pool_features, 1)
        return b.concat([b1, b5, b3, bp], 1)

    def block_b(x: Tensor) -> Tensor:
        b3 = conv_bn(x, 384, 3, stride=2)
        bd = conv_bn(conv_bn(conv_bn(x, 64, 1), 96, 3, pad=1), 96, 3, stride=2)
        bp = b.pool2d(x, 3, stride=2)
        return b.concat([b3, bd, bp], 1)

    def block_c(x: Tensor, c7: int) -> Tensor:
        b1 = conv_bn(x, 192, 1)
        b7 = conv_bn(conv_bn(conv_bn(x, c7, 1), c7, (1, 7), pad=(0, 3)), 192, (7, 1), pad=(3, 0))
        bd = conv_bn(x, c7, 1)
        bd = conv_bn(bd, c7, (7, 1), pad=(3, 0))
        bd = conv_bn(bd, c7, (1, 7), pad=(0, 3))
        bd = conv_bn(bd, c7, (7, 1), pad=(3, 0))
        bd = conv_bn(bd, 192, (1, 7), pad=(0, 3))
        bp = conv_bn(b.pool2d(x, 3, stride=1, pad=1), 192, 1)
        return b.concat([b1, b7, bd, bp], 1)

    def block_d(x: Tensor) -> Tensor:
        b3 = conv_bn(conv_bn(x, 192, 1), 320, 3, stride=2)
        b7 = conv_bn(conv_bn(conv_bn(conv_bn(x, 192, 1), 192, (1, 7), pad=(0, 3)), 192, (7, 1), pad=(3, 0)), 192, 3, stride=2)
        bp = b.pool2d(x, 3, stride=2)
        return b.concat([b3, b7, bp], 1)

    def block_e(x: Tensor) -> Tensor:
        b1 = conv_bn(x, 320, 1)
        b3 = conv_bn(x, 384, 1)
        b3 = b.concat([conv_bn(b3, 384, (1, 3), pad=(0, 1)), conv_bn(b3, 384, (3, 1), pad=(1, 0))], 1)
        bd = conv_bn(conv_bn(x, 448, 1), 384, 3, pad=1)
        bd = b.concat([conv_bn(bd, 384, (1, 3), pad=(0, 1)), conv_bn(bd, 384, (3, 1), pad=(1, 0))], 1)
        bp = conv_bn(b.pool2d(x, 3, stride=1, pad=1), 192, 1)
        return b.concat([b1, b3, bd, bp], 1)

    x = b.input("image", (batch_size, 3, 299, 299))
    x = conv_bn(x, 32, 3, stride=2)
    x = conv_bn(x, 32, 3)
    x = conv_bn(x, 64, 3, pad=1)
    x = b.pool2d(x, 3, stride=2)
    x = conv_bn(x, 80, 1)
    x = conv_bn(x, 192, 3)
    x = b.pool2d(x, 3, stride=2)
    for pool_features in (32, 64, 64):
        x = block_a(x, pool_features)
    x = block_b(x)
    for c7 in (128, 160, 160, 192):
        x = block_c(x, c7)
    x = block_d(x)
    x = block_e(block_e(x))
    x = b.reduce_mean(x, (2, 3))
    x = b.linear(x, 1000, name="fc")
    b.softmax_cross_entropy(x, name="loss")
    return b.build(source="baidu-research/PaSE graph.py Inception3")


def rnnlm(batch_size: int = 128) -> LayerGraph:
    """PaSE's RNN language model: embedding, a 2-layer LSTM of 2048 units, a projection to the vocabulary."""
    vocab, units, steps = 100000, 2048, 256
    b = LayerGraphBuilder("pase_rnnlm", batch_size)
    ids = b.input("tokens", (batch_size, steps), dtype="int64", axes=("sample", "length"))
    x = b.embedding(ids, vocab, units, name="embed")
    x = b.lstm(x, units, layers=2, name="lstm")
    x = b.linear(x, vocab, name="fc")
    b.softmax_cross_entropy(x, name="loss")
    return b.build(source="baidu-research/PaSE graph.py RNNLM")


def transformer(batch_size: int = 128) -> LayerGraph:
    """PaSE's small Transformer: 6 encoder and 6 decoder layers, d_model 512, 8 heads of 64, FF 2048."""
    seq, vocab, d_model, heads, ff, layers, d_k = 256, 50000, 512, 8, 2048, 6, 64
    b = LayerGraphBuilder("pase_transformer", batch_size)
    src = b.input("src", (batch_size, seq), dtype="int64", axes=("sample", "length"))
    tgt = b.input("tgt", (batch_size, seq), dtype="int64", axes=("sample", "length"))
    pos = b.input("pos_enc", (batch_size, seq, d_model), axes=("sample", "length", "channel"))

    def attention(xs: list[Tensor]) -> Tensor:
        # s: stacked q/k/v, b: batch, l: length, e: d_model, h: heads, k: d_k (PaSE's letters)
        if len(xs) == 3:
            qkv = b.einsum("sble,shek->sbhlk", b.stack(xs), Weight((3, heads, d_model, d_k)))
        else:
            qkv = b.einsum("ble,shek->sbhlk", xs[0], Weight((3, heads, d_model, d_k)))
        q, k, v = b.unstack(qkv)
        w = b.softmax(b.einsum("bhlk,bhmk->bhlm", q, k), axis=3)
        out = b.einsum("bhlk,hek->ble", b.einsum("bhlm,bhmk->bhlk", w, v), Weight((heads, d_model, d_k)))
        return b.layernorm(b.elementwise(xs[0], out))

    def feed_forward(x: Tensor) -> Tensor:
        h = b.einsum("ble,ef->blf", x, Weight((d_model, ff)), pw=2)
        h = b.einsum("blf,fe->ble", h, Weight((ff, d_model)))
        return b.layernorm(b.elementwise(x, h))

    x = b.elementwise(b.embedding(src, vocab, d_model), pos)
    for _ in range(layers):
        x = feed_forward(attention([x]))
    enc = x
    x = b.elementwise(b.embedding(tgt, vocab, d_model), pos)
    for _ in range(layers):
        x = feed_forward(attention([attention([x]), enc, enc]))
    x = b.einsum("ble,ev->blv", x, Weight((d_model, vocab)))
    b.softmax_cross_entropy(x, name="loss")
    return b.build(source="baidu-research/PaSE graph.py Transformer")


#: the graphs by PaSE's ``--graph`` name
GRAPHS = {"alexnet": alexnet, "inception3": inception3, "rnnlm": rnnlm, "transformer": transformer}
