"""Checkpoints saved on a GPU load on CPU by default, and into CUDA models."""

import torch

import safetorch as st


def test_gpu_checkpoint_loads_on_cpu_by_default(tmp_path):
    net = torch.nn.DataParallel(torch.nn.Linear(4, 4).cuda())
    path = tmp_path / "gpu.pt"
    torch.save({"state_dict": net.state_dict()}, path)
    out = st.load(path)
    assert all(v.device.type == "cpu" for v in out["state_dict"].values())
    plain = torch.nn.Linear(4, 4)
    assert st.load_state_dict(plain, path).ok
    torch.testing.assert_close(plain.weight, net.module.weight.cpu())


def test_load_into_cuda_model_and_map_location(tmp_path):
    path = tmp_path / "cpu.pt"
    src = torch.nn.Linear(4, 4)
    torch.save(torch.nn.DataParallel(src).state_dict(), path)
    target = torch.nn.Linear(4, 4).cuda()
    assert st.load_state_dict(target, path).ok
    assert target.weight.device.type == "cuda"
    torch.testing.assert_close(target.weight.cpu(), src.weight)
    assert st.load(path, map_location="cuda")["module.weight"].device.type == "cuda"
