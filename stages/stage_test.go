package stages

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/state"
)

type named string

func (n named) Name() string                    { return string(n) }
func (n named) Run(context.Context, *Env) error { return nil }
func all() []Stage {
	var out []Stage
	for _, n := range Order {
		out = append(out, named(n))
	}
	return out
}

func names(st []Stage) string {
	var out []string
	for _, s := range st {
		out = append(out, s.Name())
	}
	return strings.Join(out, ",")
}

func TestSelect(t *testing.T) {
	failedAtTalos := state.New("c")
	failedAtTalos.LastRun = &state.Run{Stages: Order}
	for _, n := range []string{Precheck, Provision} {
		failedAtTalos.Stage(n).Status = state.OK
	}
	failedAtTalos.Stage(Talos).Status = state.Failed

	killedInInfra := state.New("c")
	killedInInfra.LastRun = &state.Run{Stages: []string{Infra, Flux}}
	killedInInfra.Stage(Infra).Status = state.Running

	onlyInfraFailed := state.New("c")
	onlyInfraFailed.LastRun = &state.Run{Stages: []string{Infra}}
	onlyInfraFailed.Stage(Infra).Status = state.Failed

	killedBetween := state.New("c")
	killedBetween.LastRun = &state.Run{Stages: Order}
	killedBetween.Stage(Precheck).Status = state.OK

	allOK := state.New("c")
	allOK.LastRun = &state.Run{Stages: Order}
	for _, n := range Order {
		allOK.Stage(n).Status = state.OK
	}

	cases := []struct {
		name    string
		sel     Selection
		st      *state.State
		want    string
		wantErr string
	}{
		{"default is all", Selection{}, nil, strings.Join(Order, ","), ""},
		{"all", Selection{Stage: "all"}, nil, strings.Join(Order, ","), ""},
		{"one stage", Selection{Stage: "infra"}, nil, "infra", ""},
		{"alias k3s", Selection{Stage: "k3s"}, nil, "talos", ""},
		{"alias apps", Selection{Stage: "APPS"}, nil, "flux", ""},
		{"from", Selection{From: "talos"}, nil, "talos,infra,flux,postcheck", ""},
		{"from alias", Selection{From: "apps"}, nil, "flux,postcheck", ""},
		{"unknown stage", Selection{Stage: "k8s"}, nil, "", `unknown stage "k8s" for --stage: valid names are all, precheck`},
		{"unknown from", Selection{From: "all"}, nil, "", `unknown stage "all" for --from`},
		{"two selectors", Selection{Stage: "talos", From: "infra"}, nil, "", "use only one of"},
		{"resume at failure", Selection{Resume: true}, failedAtTalos, "talos,infra,flux,postcheck", ""},
		{"resume after kill", Selection{Resume: true}, killedInInfra, "infra,flux", ""},
		{"resume keeps the last run's range", Selection{Resume: true}, onlyInfraFailed, "infra", ""},
		{"resume after kill between stages", Selection{Resume: true}, killedBetween, "provision,talos,infra,flux,postcheck", ""},
		{"resume with nothing recorded", Selection{Resume: true}, state.New("c"), "", "no previous run"},
		{"resume when all ok", Selection{Resume: true}, allOK, "", "completed every stage"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Select(all(), tc.sel, tc.st)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("want error containing %q, got %v", tc.wantErr, err)
				}
				var nothing *ErrNothingToResume
				if !config.IsUserError(err) && !errors.As(err, &nothing) {
					t.Fatalf("selection errors must be user errors: %T", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if names(got) != tc.want {
				t.Fatalf("got %s, want %s", names(got), tc.want)
			}
		})
	}
}

func TestSelectOnlyRegistered(t *testing.T) {
	_, err := Select([]Stage{named(Precheck)}, Selection{Stage: "flux"}, nil)
	if err == nil || !strings.Contains(err.Error(), "not available in this build") {
		t.Fatalf("got %v", err)
	}
}
