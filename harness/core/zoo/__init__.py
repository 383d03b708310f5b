"""Model zoo: plain-torch definitions of the networks the reproduced papers benchmark.

One module per family (``lenet``, ``alexnet``, ``vgg``, ``inception``, ``resnet``,
``transformer``, ``nmt``, ``holography``, ``nasnet``, ``pnasnet``, ``rnnlm``), each exposing
factory functions whose keyword arguments are the paper's sizes; ``conf/model/<name>.yaml``
points at them with ``_target_`` (e.g. ``harness.core.zoo.resnet.resnet50``). The factories are
deliberately not re-exported here: several share their module's name (``alexnet``, ``nmt``,
``rnnlm``, ``transformer``), and binding them on the package would shadow the submodules that
those dotted ``_target_`` paths walk through.
"""
