"""Run health: warnings a long pretraining run should raise while it goes on.

The training loop feeds a HealthMonitor what it already has on display steps and after
evaluations; the monitor returns warnings (one line each) and the loop logs them to the
console and dllog.json. Rank 0 speaks for all ranks: per-rank step times are gathered on
display steps only, so a healthy run pays nothing extra.

  masked-LM accuracy fell    an evaluation below the previous one by more than
                             `accuracy_drop` (learning rate too high, bad data, a resume
                             with other settings)
  loss scale falling         float16 loss scaling halved the scale in `scale_windows`
                             display windows in a row, or skipped more of a window's
                             updates than it applied (overflowing gradients; a window
                             ends at an applied update, and the first holds the scale's
                             fall from its initial value)
  FPS drop                   a span's sentences/s below `fps_drop` x the median of the
                             run's earlier spans (a slow disk, a throttled card, another
                             job on the host); a span is a display window, or windows in
                             a row, of `min_span_s` or more (a short one is all jitter)
  slow rank                  one rank's input + forward time above `lag` x the median
                             rank's and at least `min_lag_s` more (a card or host that
                             lags holds every all-reduce back)
"""

import statistics


class HealthMonitor(object):
  """Turns the loop's numbers into warnings.

  Args:
    accuracy_drop: absolute fall of masked-LM accuracy between evaluations that warns.
    fps_drop: a span slower than this fraction of the median earlier span warns.
    min_windows: spans seen before FPS drops are judged (start-up is slow).
    min_span_s: display windows are judged together until they last this many seconds.
    scale_windows: display windows in a row with a falling loss scale that warn.
    lag: a rank slower than this multiple of the median rank warns...
    min_lag_s: ...and slower by at least this many seconds (short steps are noisy).
  """

  def __init__(self, accuracy_drop=0.002, fps_drop=0.5, min_windows=3, min_span_s=2.0,
               scale_windows=3, lag=1.3, min_lag_s=0.05):
    self.accuracy_drop = accuracy_drop
    self.fps_drop = fps_drop
    self.min_windows = min_windows
    self.min_span_s = min_span_s
    self.scale_windows = scale_windows
    self.lag = lag
    self.min_lag_s = min_lag_s
    self._last_accuracy = None
    self._span_fps = []  # the judged spans'
    self._span = [0.0, 0.0]  # the span going on: sentences, seconds
    self._last_scale = None
    self._scale_falls = 0
    self._last_skipped = None

  def evaluation(self, step, accuracy):
    """After an evaluation. Returns a list of warning lines."""
    warnings = []
    if self._last_accuracy is not None and accuracy < self._last_accuracy - self.accuracy_drop:
      warnings.append("masked-LM accuracy fell from %.4f to %.4f at step %d; check the "
                      "learning rate and the data" % (self._last_accuracy, accuracy, step))
    self._last_accuracy = accuracy
    return warnings

  def window(self, step, fps, window_steps, loss_scale=None, skipped_steps=None,
             seconds=None):
    """After a display window of `window_steps` updates at `fps` sentences/s.

    Args:
      step: the update the window ended at.
      fps: the window's sentences per second.
      window_steps: updates in the window, skipped ones included.
      loss_scale, skipped_steps: the float16 loss scale and the run's count of skipped
        updates at the end of the window (None without loss scaling).
      seconds: the window's length (None: a span by itself).

    Returns:
      A list of warning lines.
    """
    warnings = []
    seconds = self.min_span_s if seconds is None else seconds
    self._span = [self._span[0] + fps * seconds, self._span[1] + seconds]
    if self._span[1] >= self.min_span_s:
      fps = self._span[0] / self._span[1]
      self._span = [0.0, 0.0]
      if len(self._span_fps) >= self.min_windows:
        median = statistics.median(self._span_fps)
        if fps < self.fps_drop * median:
          warnings.append("throughput fell to %.2f sentences/s at step %d, %.0f%% of the "
                          "run's median %.2f; look for another job, a slow disk or a "
                          "throttled card" % (fps, step, 100.0 * fps / median, median))
      self._span_fps.append(fps)
    if loss_scale is not None:
      if self._last_scale is not None and loss_scale < self._last_scale:
        self._scale_falls += 1
      else:
        self._scale_falls = 0
      if self._scale_falls >= self.scale_windows:
        warnings.append("the loss scale fell in %d display windows in a row (now %g at step "
                        "%d): gradients keep overflowing; lower --learning_rate or check the "
                        "data" % (self._scale_falls, loss_scale, step))
      self._last_scale = loss_scale
    if skipped_steps is not None:
      skipped = skipped_steps - (self._last_skipped or 0)
      if self._last_skipped is not None and 2 * skipped > window_steps:
        warnings.append("%d of the %d updates up to step %d were skipped (non-finite "
                        "gradients): the weights train on fewer than half the batches; lower "
                        "--learning_rate or check the data" % (skipped, window_steps, step))
      self._last_skipped = skipped_steps
    return warnings

  def rank_step_times(self, step, seconds):
    """On a display step: each rank's mean step time of the window, in rank order.

    Returns:
      A list of warning lines (at most one: the slowest rank).
    """
    if len(seconds) < 2:
      return []
    median = statistics.median(seconds)
    slowest = max(range(len(seconds)), key=lambda r: seconds[r])
    if seconds[slowest] > self.lag * median and \
        seconds[slowest] - median >= self.min_lag_s:
      return ["rank %d is slow: %.3f s a step against the ranks' median %.3f s at step %d; "
              "every all-reduce waits for it" % (slowest, seconds[slowest], median, step)]
    return []
