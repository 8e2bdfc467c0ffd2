package talos

import (
	"errors"
	"strings"
	"testing"
)

func TestPlanUpgrades(t *testing.T) {
	nodes := []Target{{Name: "wk-1", Role: RoleWorker}, {Name: "cp-1", Role: RoleControlPlane}, {Name: "cp-2", Role: RoleControlPlane}, {Name: "cp-3", Role: RoleControlPlane}}
	live := map[string]string{"wk-1": "v1.13.2", "cp-1": "v1.13.2", "cp-2": "v1.13.3", "cp-3": "v1.13.2"}
	steps, err := PlanUpgrades(nodes, live, "v1.13.3", false)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range steps {
		got = append(got, s.String())
	}
	want := []string{
		"upgrade Talos on cp-1 v1.13.2 → v1.13.3 (1/3, control planes first)",
		"upgrade Talos on cp-3 v1.13.2 → v1.13.3 (2/3, control planes first)",
		"upgrade Talos on wk-1 v1.13.2 → v1.13.3 (3/3, workers after the control planes)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	var pe *PlanError
	if _, err := PlanUpgrades(nodes, live, "v1.13.2", false); !errors.As(err, &pe) || !strings.Contains(pe.Reason, "cp-2") || !strings.Contains(pe.Reason, "downgrade is refused") {
		t.Fatalf("downgrade: %v", err)
	}
	if steps, err := PlanUpgrades(nodes, live, "v1.13.2", true); err != nil || len(steps) != 1 || steps[0].Name != "cp-2" {
		t.Fatalf("allowed downgrade: %v %v", steps, err)
	}
	two := []Target{{Name: "cp-1", Role: RoleControlPlane}, {Name: "cp-2", Role: RoleControlPlane}}
	if _, err := PlanUpgrades(two, map[string]string{"cp-1": "v1.13.2", "cp-2": "v1.13.2"}, "v1.13.3", false); !errors.As(err, &pe) || !strings.Contains(pe.Reason, "2 control planes") {
		t.Fatalf("two control planes: %v", err)
	}
	if _, err := PlanUpgrades(nodes, map[string]string{"cp-1": "v1.13.2"}, "v1.13.3", false); err == nil || errors.As(err, &pe) {
		t.Fatalf("unknown versions: %v", err)
	}
	// The 1.13 installer's pre-flight check refuses hosts below 1.11
	// (talos113.MinimumHostUpgradeVersion): refused here, before the
	// call it would fail after.
	old := map[string]string{"wk-1": "v1.10.7", "cp-1": "v1.12.6", "cp-2": "v1.12.6", "cp-3": "v1.12.6"}
	if _, err := PlanUpgrades(nodes, old, "v1.13.3", false); !errors.As(err, &pe) || !strings.Contains(pe.Reason, "runs Talos v1.10.7: the Talos v1.13.3 installer refuses to install over it (host version 1.10.7 is too old to upgrade to Talos 1.13.3") {
		t.Fatalf("host below the installer's minimum: %v", err)
	}
	old["wk-1"] = "v1.11.5"
	if steps, err := PlanUpgrades(nodes, old, "v1.13.3", false); err != nil || len(steps) != 4 {
		t.Fatalf("hosts the installer accepts: %v %v", steps, err)
	}
	// A release this machinery does not know is left to its installer.
	if _, err := PlanUpgrades(nodes, old, "v1.15.0", false); err != nil {
		t.Fatalf("unknown target release: %v", err)
	}
}

// A node at the wanted version that runs another schematic (or a stock
// image) is upgraded in place; with no schematic wanted, versions alone count.
func TestPlanSchematicChange(t *testing.T) {
	nodes := []Target{{Name: "cp-1", Role: RoleControlPlane}, {Name: "wk-1", Role: RoleWorker}, {Name: "wk-2", Role: RoleWorker}}
	live := map[string]Running{
		"cp-1": {Version: "v1.13.3", Schematic: "aaaa"},
		"wk-1": {Version: "v1.13.3", Schematic: "bbbb"},
		"wk-2": {Version: "v1.13.3"},
	}
	steps, err := PlanUpgradesTo(nodes, live, Running{Version: "v1.13.3", Schematic: "bbbb"}, false)
	if err != nil || len(steps) != 2 || steps[0].Name != "cp-1" || steps[1].Name != "wk-2" {
		t.Fatalf("steps %+v, %v", steps, err)
	}
	if s := steps[0].String(); !strings.Contains(s, "in place, v1.13.3 with schematic bbbb (was aaaa)") {
		t.Errorf("step reads %q", s)
	}
	if s := steps[1].String(); !strings.Contains(s, "was none: not an Image Factory image") {
		t.Errorf("step reads %q", s)
	}
	if steps, err := PlanUpgradesTo(nodes, live, Running{Version: "v1.13.3"}, false); err != nil || len(steps) != 0 {
		t.Errorf("no schematic wanted: %+v %v", steps, err)
	}
}
