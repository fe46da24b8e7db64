package nftables_test

import (
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netlinkbuf"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// deafen makes the kernel drop every answer to what c sends next: the
// receive buffer at its minimum, filled by the answers to generation
// requests that c never reads, and no ENOBUFS error for the answers that
// do not fit, which the kernel then drops without a word. A request sent
// after gets no answer, as from a kernel that hangs; the reads of c find
// the queued answers, then wait.
func deafen(c *netlink.Conn) error {
	if err := netlinkbuf.Force(c, 0, 1); err != nil {
		return err
	}
	if err := c.SetOption(netlink.NoENOBUFS, true); err != nil {
		return err
	}
	for range 8 {
		req := netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
			Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
		}
		if _, err := c.Send(req); err != nil {
			return err
		}
	}
	return nil
}

// TestApplyElementBatchTimeout sends a writer's partial sync, an
// element batch, on a socket whose acknowledgements the kernel drops:
// ApplyElementBatch must give up at its bound with an error
// IsCommandTimeout recognises, and the writer, told so, must make its
// next sync full.
func TestApplyElementBatchTimeout(t *testing.T) {
	kerneltest.Require(t, "nft")
	for _, fam := range batchFamilies {
		t.Run(string(fam.family), func(t *testing.T) {
			ns := kerneltest.NewNS(t)
			nft := nsNFT(t, ns, fam.nft)
			w, err := nftables.NewWriter(nft, nftables.WriterConfig{Family: fam.family, Node: proxy.NodeConfig{Name: node}, NetlinkElementSyncs: true})
			if err != nil {
				t.Fatal(err)
			}
			c := newCluster(fam.family, node)
			c.setService(makeService("ns", "one", fam.svc(1)))
			c.setEndpoints("ns", "one", tcp8080, remote(fam.podA))
			applyIn(t, ns, nft, w, c.input(), true)

			// The same number of endpoints: only elements change.
			c.setEndpoints("ns", "one", tcp8080, remote(fam.podB))
			res := syncIn(t, ns, w, c.input())
			if res.Full || res.Batch == nil {
				t.Fatalf("sync full=%v, batch %v; want a partial sync sent as a batch", res.Full, res.Batch != nil)
			}
			done := make(chan error, 1)
			go func() {
				done <- ns.Do(func() error { return nftables.ApplyElementBatchWith(*res.Batch, 100*time.Millisecond, deafen) })
			}()
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				t.Fatal("ApplyElementBatch still waits for acknowledgements that never come")
			}
			if !nftables.IsCommandTimeout(err) {
				t.Fatalf("batch without acknowledgements: error %v, want a timeout", err)
			}
			w.Applied(err)
			if res := syncIn(t, ns, w, c.input()); !res.Full {
				t.Error("the sync after a timed-out batch is partial, want full")
			}
		})
	}
}
