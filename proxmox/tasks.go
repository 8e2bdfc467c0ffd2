package proxmox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/homelab/bootstrap/internal/retry"
	"github.com/homelab/bootstrap/internal/wait"
)

// taskNode returns the node field of a UPID ("UPID:<node>:...").
func taskNode(upid string) (string, error) {
	parts := strings.Split(upid, ":")
	if len(parts) < 8 || parts[0] != "UPID" || parts[1] == "" {
		return "", fmt.Errorf("malformed task ID %q", upid)
	}
	return parts[1], nil
}

// waitTask polls a task's status until it stops, from every TaskPoll backing
// off to every TaskPollMax, instead of Telmate's fixed 2-second sleep, and turns a failed exit status into a
// TaskError (retryable when it is a lock text).
func (c *Client) waitTask(ctx context.Context, upid, what string, timeout time.Duration) error {
	return c.waitTaskFrom(ctx, upid, what, timeout, c.opts.TaskPoll)
}

// waitTaskFrom is waitTask with first as the first interval between polls
// (backing off from it as waitTask does from TaskPoll).
func (c *Client) waitTaskFrom(ctx context.Context, upid, what string, timeout, first time.Duration) error {
	if upid == "" {
		return nil
	}
	node, err := taskNode(upid)
	if err != nil {
		return err
	}
	path := "/nodes/" + node + "/tasks/" + upid + "/status"
	return wait.Until(ctx, wait.Spec{What: what, Timeout: timeout, Interval: first, MaxInterval: max(first, c.opts.TaskPollMax), Log: c.log},
		func(ctx context.Context) (bool, string, error) {
			cctx, cl := withCall(ctx)
			m, err := c.px.GetItemList(cctx, path)
			if err != nil {
				cerr := cl.classify("GET", path, err)
				if retry.IsRetryable(cerr) {
					return false, "status poll failed: " + cerr.Error(), nil
				}
				return false, "", cerr
			}
			st, _ := m["data"].(map[string]any)
			if st == nil || st["status"] != "stopped" {
				return false, "running", nil
			}
			exit, _ := st["exitstatus"].(string)
			if exit == "OK" || strings.HasPrefix(exit, "WARNINGS") {
				return true, exit, nil
			}
			te := &TaskError{UPID: upid, What: what, ExitStatus: exit}
			if lockText.MatchString(exit) {
				return false, "", retry.Retryable(te)
			}
			return false, "", te
		})
}
