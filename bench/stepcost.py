"""placeholder, replaced below"""


def measure(reps, window_s, root, ddp):
    return None
