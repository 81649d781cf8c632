def my_label_smoothing(logits, target, eps_ls, pad_id):
    V = logits.size(-1)
    q = torch.full_like(logits, eps_ls / (V - 2))
    q[..., pad_id] = 0.0
    q.scatter_(-1, target[..., None], 1.0 - eps_ls)
    return -(q * logits.log_softmax(-1)).sum(-1).masked_fill(target == pad_id, 0.0).sum()
