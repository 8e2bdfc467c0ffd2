package postcheck

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/talos"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
)

// certs warns when the client certificates in the talosconfig and the
// kubeconfig expire within CertWarnDays (Talos issues them for one year),
// and fails once one expired; the row's next step (nextSteps) names the
// command that renews both: the talos stage replaces each within its last
// 30 days (talos.RenewBefore).
func (c *checker) certs(ctx context.Context) (check.Status, string) {
	type cert struct {
		what string
		exp  time.Time
	}
	var certs []cert
	var problems []string
	if exp, err := c.kubeconfigCertExpiry(); err != nil {
		problems = append(problems, "kubeconfig: "+err.Error())
	} else {
		certs = append(certs, cert{"kubeconfig admin cert", exp})
	}
	if c.o.TalosconfigPath != "" {
		if exp, err := c.talosconfigCertExpiry(); err != nil {
			problems = append(problems, "talosconfig: "+err.Error())
		} else {
			certs = append(certs, cert{"talosconfig client cert", exp})
		}
	}
	now := c.o.now()
	limit := now.Add(time.Duration(c.o.CertWarnDays) * 24 * time.Hour)
	var soon, expired, fine []string
	for _, ct := range certs {
		s := fmt.Sprintf("%s expires %s", ct.what, ct.exp.UTC().Format("2006-01-02"))
		switch {
		case ct.exp.Before(now):
			expired = append(expired, s)
		case ct.exp.Before(limit):
			soon = append(soon, fmt.Sprintf("%s (in %d days)", s, int(ct.exp.Sub(now).Hours()/24)))
		default:
			fine = append(fine, s)
		}
	}
	switch {
	case len(expired) > 0:
		return check.Failf("expired: %s", strings.Join(expired, "; "))
	case len(soon) > 0 || len(problems) > 0:
		return check.Warnf("%s", strings.Join(append(soon, problems...), "; "))
	}
	return check.Passf("%s", strings.Join(fine, "; "))
}

func (c *checker) kubeconfigCertExpiry() (time.Time, error) {
	data, err := c.kubeconfig()
	if err != nil {
		return time.Time{}, err
	}
	return talos.KubeconfigCertExpiry(data)
}

func (c *checker) talosconfigCertExpiry() (time.Time, error) {
	data, err := c.o.Files.Read(c.o.TalosconfigPath)
	if err != nil {
		return time.Time{}, err
	}
	cfg, err := talosconfig.FromBytes(data)
	if err != nil {
		return time.Time{}, err
	}
	ctx, ok := cfg.Contexts[cfg.Context]
	if !ok {
		return time.Time{}, fmt.Errorf("no current context")
	}
	pemBytes, err := base64.StdEncoding.DecodeString(ctx.Crt)
	if err != nil {
		return time.Time{}, fmt.Errorf("client cert: %w", err)
	}
	return talos.CertExpiry(pemBytes)
}
