#!/usr/bin/env python3
"""torchrun for Debian 12's PyTorch 1.13 on Python 3.11.

Debian's /usr/bin/torchrun stops before starting any worker with
"AttributeError: 'NoneType' object has no attribute 'get'": its Std.from_str looks the
value up by iterating an IntFlag, and Python 3.11 no longer yields the flag's 0 and
multi-bit members (fixed in PyTorch 2.0). This is torchrun with that one function replaced:

    /usr/bin/python3 examples/torchrun.py --nproc_per_node 2 examples/ddp_langid.py --split DIR
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _std_from_str(vm):
    if re.fullmatch(r"[0-3]", vm):
        return api.Std(int(vm))
    return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}


api.Std.from_str = staticmethod(_std_from_str)

if __name__ == "__main__":
    from torch.distributed.run import main
    sys.exit(main())
