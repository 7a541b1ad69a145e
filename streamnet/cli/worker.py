"""streamnet-worker: the per-node daemon."""
import sys


def main(argv=None) -> int:
    print("streamnet-worker: the cluster worker is not available yet (it arrives with the "
          "ZooKeeper cluster issue); use `streamnet-submit train --local`", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
