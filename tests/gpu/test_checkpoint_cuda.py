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
    # DataParallel moved src to cuda:0 (with CUDA it puts the module on device_ids[0])
    torch.testing.assert_close(target.weight.cpu(), src.weight.cpu())
    assert st.load(path, map_location="cuda")["module.weight"].device.type == "cuda"
    with st.patched("load"):  # torch's semantics with CUDA present: storages stay where saved
        gpu_path = tmp_path / "gpu.pt"
        torch.save({"w": torch.ones(2, device="cuda")}, gpu_path)
        assert torch.load(gpu_path)["w"].device.type == "cuda"


def test_save_state_restores_cuda_rng_for_exact_resume(tmp_path):
    """CUDA dropout draws from the CUDA generator: load_state restores it on every device."""

    def steps(model, opt, n):
        out = []
        for _ in range(n):
            x = torch.randn(16, 8, device="cuda")
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        return out

    def build(seed):
        torch.manual_seed(seed)
        m = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.Dropout(0.5), torch.nn.Linear(32, 1)
        )
        m = m.cuda()
        return m, torch.optim.Adam(m.parameters(), lr=1e-3)

    model, opt = build(0)
    steps(model, opt, 2)
    path = st.save_state(tmp_path / "s.pt", model=model, optimizer=opt, epoch=2)
    reference = steps(model, opt, 3)
    model2, opt2 = build(5)
    torch.cuda.manual_seed_all(1234)
    assert st.load_state(path, model=model2, optimizer=opt2) == {"epoch": 2}
    assert steps(model2, opt2, 3) == reference
    assert model2[0].weight.device.type == "cuda"


def test_dcp_directory_into_a_cuda_model(tmp_path):
    import warnings

    import torch.distributed.checkpoint as dcp

    src = torch.nn.Linear(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(
            {"model": torch.nn.DataParallel(src).state_dict()}, checkpoint_id=str(tmp_path / "d")
        )
    target = torch.nn.Linear(4, 3).cuda()
    assert st.load_state_dict(target, tmp_path / "d").ok
    torch.testing.assert_close(target.weight.cpu(), src.weight.detach().cpu())
